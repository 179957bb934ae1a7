"""The model registry: every name a request may give as `model`, and what serves it.

A name is a model (a pool of upstreams, or the in-process engine), an alias of one, or an
adapter: a LoRA adapter loaded into the in-process engine (at start-up or at run time), or one
that a pool's upstreams list with the pool's model as `parent` (vLLM's servers with adapters).
The pipeline asks the registry once, early (`resolve`, or `chain` for a model and its
fallbacks), and from then on holds one `ServedModel`: one engine, one tokenizer, one window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from sluicegate.engine.lora import AdapterError, check_adapter_name
from sluicegate.engine.protocol import EmbeddingEngine, EngineClient
from sluicegate.engine.vllm_adapters import LoadedAdapters
from sluicegate.errors import GatewayError, InvalidRequestError, ModelNotFoundError, NotFoundError
from sluicegate.inference.service import CompletionService
from sluicegate.models.served import ServedEmbedder, ServedModel
from sluicegate.prices import Price
from sluicegate.wire.formats import ModelCard

logger = logging.getLogger(__name__)

ServiceFactory = Callable[[EngineClient, str, str, str | None], CompletionService]
"""Builds the service of a name on an engine: (engine, name, identity, adapter)."""


@dataclass(frozen=True, slots=True)
class LocalEngine:
    """The in-process engine: its base model's name, and its adapters when LoRA is on."""

    name: str
    engine: EngineClient
    adapters: LoadedAdapters | None
    identity: str
    """The base model's cache identity; an adapter's adds its own name and path."""


class ModelRegistry:
    def __init__(
        self,
        models: Iterable[ServedModel],
        aliases: dict[str, str],
        factory: ServiceFactory,
        local: LocalEngine | None = None,
        pools: Iterable[tuple[ServedModel, Callable[[], Iterable[str]]]] = (),
        embedders: Iterable[ServedEmbedder] = (),
    ) -> None:
        """`aliases`: alias -> model name. `pools`: each pool model, with what lists the
        adapters its upstreams serve. `embedders`: the embedding models."""
        self._embedders: dict[str, ServedEmbedder] = {e.name: e for e in embedders}
        self._models: dict[str, ServedModel] = {m.name: m for m in models}
        self._aliases = dict(aliases)
        self._factory = factory
        self.local = local
        self._pools = list(pools)
        self._pool_adapters: dict[str, ServedModel] = {}
        first: list[ServedModel | ServedEmbedder] = [*self._models.values()]
        self.default = (first or list(self._embedders.values()))[0]
        """The first model: what answers where a request names none (`/tokenize`)."""

    # ---- resolving ---------------------------------------------------------------------------

    def resolve(self, name: str) -> ServedModel:
        """The generative model `name` (an alias resolved), or `ModelNotFoundError` (404);
        an embedding model's name is a 400 that says what it serves."""
        found = self._models.get(self._aliases.get(name, name))
        if found is None:
            found = self._pool_adapter(name)
        if found is None:
            if self._aliases.get(name, name) in self._embedders:
                raise InvalidRequestError(
                    f"The model `{name}` serves embeddings (/v1/embeddings), not completions.",
                    param="model",
                )
            raise ModelNotFoundError(f"The model `{name}` does not exist.", param="model")
        return found

    def price_of(self, name: str) -> Price | None:
        """What the model `name`'s tokens cost, if it has a price (None for a name no longer
        served)."""
        try:
            quota = self.resolve_any(name).quota
        except GatewayError:
            return None
        return None if quota is None else quota.price

    def target(self, name: str) -> str:
        """The name an alias stands for; any other name itself."""
        return self._aliases.get(name, name)

    def names_of(self, model: str) -> list[str]:
        """Every name the model `model` is asked for by: its own, and its aliases."""
        return [model, *(alias for alias, target in self._aliases.items() if target == model)]

    def resolve_embedder(self, name: str) -> ServedEmbedder:
        """The embedding model `name` (an alias resolved), or `ModelNotFoundError`; a
        generative model's name is a 400 that says what it serves."""
        found = self._embedders.get(self._aliases.get(name, name))
        if found is None:
            self.resolve(name)  # 404 if it is nothing at all
            raise InvalidRequestError(
                f"The model `{name}` does not serve embeddings.", param="model"
            )
        return found

    def resolve_any(self, name: str) -> ServedModel | ServedEmbedder:
        """Whatever model `name` is (for `/tokenize`)."""
        found = self._embedders.get(self._aliases.get(name, name))
        return found if found is not None else self.resolve(name)

    def chain(self, name: str) -> list[ServedModel]:
        """The model `name`, then its fallbacks in order (theirs after each, depth first), each
        once. Fallbacks that are gone (an adapter unloaded) are passed over."""
        first = self.resolve(name)
        chain = [first]
        seen = {first.name}

        def add(model: ServedModel) -> None:
            for fallback in model.fallbacks:
                if fallback in seen or fallback not in self._models:
                    continue
                seen.add(fallback)
                chain.append(self._models[fallback])
                add(self._models[fallback])

        add(first)
        return chain

    def serves(self, name: str, identity: str) -> bool:
        """Whether `name` still serves the weights `identity` (for answers remembered by name,
        from before an adapter was unloaded or loaded again)."""
        try:
            return self.resolve(name).service.identity == identity
        except ModelNotFoundError:
            return False

    def names(self) -> list[str]:
        """Every name a metric may carry: models, adapters, embedding models (not aliases)."""
        return [*self._models, *self._pool_adapters, *self._embedders]

    def cards(self) -> list[ModelCard]:
        """`/v1/models`: every model, adapter, embedding model and alias."""
        self._refresh_pool_adapters()
        served: list[ServedModel | ServedEmbedder] = [
            *self._models.values(),
            *self._pool_adapters.values(),
            *self._embedders.values(),
        ]
        cards = [m.card() for m in served]
        for alias, target in self._aliases.items():
            card = (self._models.get(target) or self._embedders[target]).card()
            cards.append({**card, "id": alias})
        return cards

    def engines(self) -> list[EngineClient | EmbeddingEngine]:
        """Each engine once."""
        unique: dict[int, EngineClient | EmbeddingEngine] = {}
        served: list[ServedModel | ServedEmbedder] = [*self._models.values()]
        for model in [*served, *self._embedders.values()]:
            unique.setdefault(id(model.engine), model.engine)
        return list(unique.values())

    def local_engines(self) -> list[EngineClient | EmbeddingEngine]:
        """The in-process engines: the generative one and the embedding one, where there
        are (the gateway ends when one dies)."""
        found: list[EngineClient | EmbeddingEngine] = []
        if self.local is not None:
            found.append(self.local.engine)
        found += [e.engine for e in self._embedders.values() if e.local]
        return found

    def engine_of(self, name: str) -> EngineClient | EmbeddingEngine:
        """The engine behind a name of `names()`."""
        return self.resolve_any(name).engine

    # ---- adapters of the in-process engine ---------------------------------------------------

    async def load_adapter(
        self, name: str, path: str, roots: Sequence[str] | None = None
    ) -> ServedModel:
        """Load a LoRA adapter into the in-process engine as the model `name`, from inside
        `roots` (None: from anywhere, for the operator's `LORA_MODULES`)."""
        local = self._local_adapters()
        if name in self._models or name in self._aliases or name in self._embedders:
            raise InvalidRequestError(
                f"The name {name!r} is already served (a model, alias or adapter).",
                param="lora_name",
            )
        await local.adapters.load(name, path, roots)
        served = self._adapter_model(local, name, path)
        self._models[name] = served
        return served

    def unload_adapter(self, name: str) -> None:
        """Take the in-process adapter `name` away; requests running on it finish."""
        local = self._local_adapters()
        served = self._models.get(name)
        if served is None or not served.local or served.parent is None:
            raise NotFoundError(f"The adapter {name!r} is not loaded.", param="lora_name")
        local.adapters.unload(name)
        del self._models[name]

    def add_started_adapter(self, name: str, path: str) -> ServedModel:
        """Register an adapter loaded at start-up (`LORA_MODULES`)."""
        local = self._local_adapters()
        served = self._adapter_model(local, name, path)
        self._models[name] = served
        return served

    def _local_adapters(self) -> _LocalWithAdapters:
        local = self.local
        if local is None or local.adapters is None:
            raise NotFoundError(
                "LoRA adapters are not enabled on this gateway's engine "
                "(SLUICEGATE_ALLOW_RUNTIME_LORA, SLUICEGATE_LORA_MODULES)."
            )
        return _LocalWithAdapters(local, local.adapters)

    def _adapter_model(self, local: _LocalWithAdapters, name: str, path: str) -> ServedModel:
        base = self._models[local.local.name]
        identity = f"{local.local.identity}+lora:{name}:{local.adapters.identity(name)}"
        return self._adapter_of(base, name, identity, root=path)

    def _adapter_of(self, base: ServedModel, name: str, identity: str, root: str) -> ServedModel:
        """The adapter `name` of `base`: its engine, window and limits (the very same: its
        requests count against its base model's `rate_limit`, as an alias's do), a service and
        a card of its own, no fallbacks."""
        return replace(
            base,
            name=name,
            service=self._factory(base.engine, name, identity, name),
            root=root,
            parent=base.name,
            created=int(time.time()),
            fallbacks=(),
        )

    # ---- adapters listed by pools ------------------------------------------------------------

    def _pool_adapter(self, name: str) -> ServedModel | None:
        found = self._pool_adapters.get(name)
        if found is not None and self._still_listed(found):
            return found
        self._refresh_pool_adapters()
        return self._pool_adapters.get(name)

    def _still_listed(self, model: ServedModel) -> bool:
        for pool, listed in self._pools:
            if pool.name == model.parent:
                return model.name in set(listed())
        return False

    def _refresh_pool_adapters(self) -> None:
        """What the pools' upstreams list now: new adapters get a service, gone ones go."""
        current: dict[str, ServedModel] = {}
        for pool, listed in self._pools:
            for name in listed():
                taken = name in self._models or name in self._aliases or name in current
                if taken or name in self._embedders or not _adapter_name(name):
                    continue
                known = self._pool_adapters.get(name)
                if known is None or known.parent != pool.name:
                    known = self._adapter_of(pool, name, f"upstream:{name}", root=name)
                current[name] = known
        self._pool_adapters = current


def _adapter_name(name: str) -> bool:
    """Whether an upstream's adapter may be a name here (as one loaded here must be)."""
    try:
        check_adapter_name(name)
    except AdapterError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _LocalWithAdapters:
    local: LocalEngine
    adapters: LoadedAdapters
