"""The models the settings describe: the models file, `UPSTREAM_URLS`, or the local engine.

Checked before anything starts, so that a wrong models file is one line for the operator.
"""

from __future__ import annotations

from sluicegate.engine.lora import parse_lora_modules
from sluicegate.engine.model import resolve_model
from sluicegate.engine.vllm_embeddings import EmbeddingConfig
from sluicegate.engine.vllm_engine import EngineConfig
from sluicegate.models.config import (
    ModelEntry,
    ModelsFileError,
    UpstreamEntry,
    check_entries,
    parse_models_file,
)
from sluicegate.settings import Settings
from sluicegate.wiring.engines import embedding_config, engine_config
from sluicegate.worker import EMBEDDING, GENERATIVE


class ModelsError(Exception):
    """The models the settings describe cannot be served; one line for the operator."""


def model_entries(settings: Settings) -> list[ModelEntry]:
    """What the registry serves: the models file's entries, else one model: the upstreams of
    `UPSTREAM_URLS` (named by `SERVED_MODEL_NAME`, or by what they serve), else the
    in-process engine. Reads the file: call it off the event loop once serving."""
    adapters = [m.name for m in parse_lora_modules(settings.lora_modules)]
    if settings.models_file is not None:
        path = settings.models_file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelsError(f"cannot read the models file {path}: {exc.strerror}") from None
        try:
            entries = parse_models_file(text, str(path))
            check_entries(entries, str(path), reserved=adapters)
        except ModelsFileError as exc:
            raise ModelsError(str(exc)) from None
        check_embedding_name(settings, entries)
        if adapters and not any(e.is_local for e in entries):
            raise ModelsError(
                f"LORA_MODULES loads adapters into the in-process engine, which {path} does "
                "not start (no entry with `engine: local`)"
            )
        return entries
    if settings.upstreams:
        if adapters:
            raise ModelsError("LORA_MODULES needs the in-process engine; UPSTREAM_URLS is set")
        # Named once its upstreams say what they serve, unless SERVED_MODEL_NAME names it.
        upstreams = [UpstreamEntry(url=u, weight=w) for u, w in settings.upstreams]
        shorthand = ModelEntry.model_construct(
            name="", upstreams=upstreams, aliases=[], fallbacks=[], kind="chat"
        )
        return [shorthand]
    entries = [ModelEntry(name=settings.model_name, engine="local")]
    check_embedding_name(settings, entries)
    if settings.model_name in adapters:
        raise ModelsError(f"the adapter {settings.model_name!r} has the engine's own name")
    return entries


def check_embedding_name(settings: Settings, entries: list[ModelEntry]) -> None:
    """The in-process embedding engine's name is taken by no entry, alias or adapter."""
    name = settings.embedding_name
    if name is None:
        return
    taken = {n for e in entries for n in (e.name, *e.aliases)}
    taken |= {m.name for m in parse_lora_modules(settings.lora_modules)}
    if name in taken:
        raise ModelsError(
            f"the embedding engine's name {name!r} is already a model's, an alias or an "
            "adapter (set SLUICEGATE_EMBEDDING_SERVED_NAME)"
        )


def uses_local_engine(entries: list[ModelEntry]) -> bool:
    return any(entry.is_local for entry in entries)


def local_engine_configs(settings: Settings) -> dict[str, EngineConfig | EmbeddingConfig]:
    """The in-process engines the settings ask for, by kind (`worker.GENERATIVE`,
    `worker.EMBEDDING`): what the supervisor launches a core of for its workers."""
    configs: dict[str, EngineConfig | EmbeddingConfig] = {}
    local = next((e for e in model_entries(settings) if e.is_local), None)
    if local is not None:
        named = settings.model_copy(update={"served_model_name": local.name})
        configs[GENERATIVE] = engine_config(
            named, resolve_model(named.model, named.model_cache_dir)
        )
    if settings.embedding_model is not None:
        configs[EMBEDDING] = embedding_config(settings)
    return configs
