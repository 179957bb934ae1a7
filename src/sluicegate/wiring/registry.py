"""The model registry: every engine the models need, started, and each model's service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from typing import cast

from sluicegate.engine.lora import parse_lora_modules
from sluicegate.engine.model import model_identity
from sluicegate.engine.protocol import EmbeddingEngine, EngineClient
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.errors import GatewayError
from sluicegate.inference.admission import Admission
from sluicegate.inference.embeddings import EmbeddingLimits, EmbeddingService
from sluicegate.models.config import ModelEntry, ModelPrice, ModelRateLimit
from sluicegate.models.registry import LocalEngine, ModelRegistry
from sluicegate.models.served import ServedEmbedder, ServedModel
from sluicegate.prices import Price
from sluicegate.quota.quotas import ModelQuota
from sluicegate.quota.window import RateLimit
from sluicegate.settings import Settings
from sluicegate.wiring.engines import (
    EmbedderFactory,
    LocalFactory,
    PoolFactory,
    embedding_model_folder,
    start_local_embedder,
    start_local_engine,
    start_pool,
    upstream_config,
)
from sluicegate.wiring.entries import ModelsError, model_entries
from sluicegate.wiring.inference import service_factory


async def open_models(
    settings: Settings,
    stack: AsyncExitStack,
    local_factory: LocalFactory = start_local_engine,
    pool_factory: PoolFactory = start_pool,
    embedder_factory: EmbedderFactory = start_local_embedder,
    admission: Admission | None = None,
) -> ModelRegistry:
    """Start every engine the models need (at once), register their shutdowns on `stack`,
    load the start-up adapters, and build the registry; its engines are admitted under
    `admission`'s bounds (the settings' unless given)."""
    entries = await asyncio.to_thread(model_entries, settings)
    local_entry = next((e for e in entries if e.is_local), None)
    engines: dict[int, EngineClient | EmbeddingEngine] = {}
    embedders: list[EmbeddingEngine] = []

    async def start(index: int, entry: ModelEntry) -> None:
        engine: EngineClient | EmbeddingEngine
        if entry.is_local:
            named = settings.model_copy(update={"served_model_name": entry.name})
            engine = await local_factory(named)
        else:
            # The shorthand of `UPSTREAM_URLS` (no name yet) is all settings.
            engine = await pool_factory(upstream_config(settings, entry if entry.name else None))
        stack.push_async_callback(engine.shutdown)
        engines[index] = engine

    async def start_embedder() -> None:
        embedder = await embedder_factory(settings)
        stack.push_async_callback(embedder.shutdown)
        embedders.append(embedder)

    async with asyncio.TaskGroup() as group:
        for index, entry in enumerate(entries):
            group.create_task(start(index, entry))
        if settings.embedding_model is not None:
            group.create_task(start_embedder())
    factory = service_factory(settings, admission)
    now = int(time.time())
    models: list[ServedModel] = []
    pools: list[tuple[ServedModel, Callable[[], Iterable[str]]]] = []
    served_embedders: list[ServedEmbedder] = []
    local: LocalEngine | None = None
    limits = EmbeddingLimits(settings.max_embedding_inputs, settings.max_embedding_values)
    for index, entry in enumerate(entries):
        engine = engines[index]
        if entry.kind != "chat":
            upstream_model = getattr(engine, "model", entry.name)
            embedder_engine = cast(EmbeddingEngine, engine)
            service = EmbeddingService(
                embedder_engine, entry.name, limits, identity=f"upstream:{upstream_model}"
            )
            forward = engine.post_json if isinstance(engine, UpstreamEngine) else None
            served_embedders.append(
                ServedEmbedder(
                    entry.name,
                    service,
                    upstream_model,
                    now,
                    _model_quota(entry.name, entry, settings),
                    forward=forward if entry.kind == "rerank" else None,
                )
            )
            continue
        engine = cast(EngineClient, engine)
        if entry.is_local:
            name = entry.name
            identity = await asyncio.to_thread(
                model_identity, settings.model, settings.model_cache_dir, settings.revision
            )
            root = settings.model or settings.model_name
        else:
            upstream_model = getattr(engine, "model", entry.name)
            name = entry.name or settings.served_model_name or upstream_model
            # The upstreams' own model id: replicas in front of the same fleet share entries.
            identity, root = f"upstream:{upstream_model}", upstream_model
        served = ServedModel(
            name=name,
            service=factory(engine, name, identity, None),
            root=root,
            created=now,
            fallbacks=tuple(entry.fallbacks),
            quota=_model_quota(name, entry, settings),
            local=entry.is_local,
        )
        models.append(served)
        if entry.is_local:
            local = LocalEngine(name, engine, getattr(engine, "adapters", None), identity)
        elif isinstance(engine, UpstreamEngine):
            pools.append((served, engine.listed_adapters))
    if embedders:
        embedding_name = settings.embedding_name
        assert embedding_name is not None
        folder = await asyncio.to_thread(embedding_model_folder, settings)
        weights = await asyncio.to_thread(model_identity, folder, settings.model_cache_dir, None)
        service = EmbeddingService(
            embedders[0], embedding_name, limits, identity=f"embed:{weights}"
        )
        quota = ModelQuota(embedding_name, price=_price(embedding_name, settings))
        served_embedders.append(
            ServedEmbedder(embedding_name, service, folder, now, quota, local=True)
        )
    aliases = {alias: e.name for e in entries for alias in e.aliases}
    registry = ModelRegistry(models, aliases, factory, local, pools, served_embedders)
    await _load_started_adapters(settings, registry, local_entry)
    return registry


def _model_quota(name: str, entry: ModelEntry, settings: Settings) -> ModelQuota:
    """The model's limits across every key (none unless its entry has a `rate_limit`) and its
    price (`MODEL_PRICES` over the entry's `price`)."""
    limit = entry.rate_limit or ModelRateLimit()
    return ModelQuota(
        name,
        RateLimit(limit.requests_per_minute, limit.tokens_per_minute),
        _price(name, settings, entry.price),
    )


def _price(name: str, settings: Settings, listed: ModelPrice | None = None) -> Price | None:
    """A model's price: `MODEL_PRICES`'s, over the one its models-file entry lists."""
    price = settings.model_prices.get(name) or listed
    return None if price is None else price.price()


async def _load_started_adapters(
    settings: Settings, registry: ModelRegistry, local_entry: ModelEntry | None
) -> None:
    """`LORA_MODULES`, loaded into the in-process engine before it serves: one that cannot be
    stops start-up, saying why."""
    for module in parse_lora_modules(settings.lora_modules):
        base = local_entry.name if local_entry is not None else settings.model_name
        if module.base_model_name not in (None, base):
            raise ModelsError(
                f"the adapter {module.name!r} is for the base model "
                f"{module.base_model_name!r}; the in-process engine serves {base!r}"
            )
        try:
            await registry.load_adapter(module.name, module.path)
        except GatewayError as exc:
            raise ModelsError(
                f"the adapter {module.name!r} cannot be loaded: {exc.message}"
            ) from None
