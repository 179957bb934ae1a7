"""From `Settings` to what each package takes, and opening what the lifespan owns.

The packages below never see `Settings`: each takes its own small config object, built here
and nowhere else, a module per subsystem. The lifespan in `app.py` opens them in this order:

- `redis`: the one client (a bounded pool) for everything the gateway keeps in Redis;
- `keys`: managed keys, and the usage ledger with its reader;
- `observability`: traces, and the keys that metrics name;
- `quotas`: rate limits, each key's share of the engines, and the budgets;
- `registry`: the models (`entries`) and their engines (`engines`), each model's service
  (`inference`);
- `cache`: the response cache and the embeddings'; `responses`: stored responses;
- `reasoning`: the keys that sign and seal the thoughts clients send back;
- `capture`: the traffic capture's file, once the models' windows are known.

Each `enter_*` function opens its part for the lifespan and registers its closing on the
lifespan's exit stack; the `open_*` functions and the config builders are what the tests
and the other processes (`cli`, `supervisor`, `server`) call. Their names are kept here too.

Importing this package imports none of them: each name below is loaded on first use, so that
a process needing one part (the supervisor reads the models file and the reasoning key, and
starts workers) does not pay for the web framework, Redis and the upstream clients of the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluicegate.wiring import (
        cache,
        capture,
        engines,
        entries,
        inference,
        keys,
        media,
        observability,
        quotas,
        reasoning,
        redis,
        registry,
        responses,
    )
    from sluicegate.wiring.cache import cache_config, embedding_cache, open_cache, ttl_rule
    from sluicegate.wiring.engines import (
        EmbedderFactory,
        LocalFactory,
        PoolFactory,
        chat_template,
        embedding_config,
        embedding_model_folder,
        engine_config,
        local_factories,
        reasoning_parser,
        start_local_embedder,
        start_local_engine,
        start_pool,
        tool_call_parser,
        upstream_config,
        watches_engine,
    )
    from sluicegate.wiring.entries import (
        ModelsError,
        check_embedding_name,
        local_engine_configs,
        model_entries,
        uses_local_engine,
    )
    from sluicegate.wiring.inference import (
        admission,
        budget_policy,
        request_limits,
        service_factory,
        structured_limits,
        timeouts,
    )
    from sluicegate.wiring.keys import open_key_store, open_ledger, usage_reader
    from sluicegate.wiring.media import media_loader
    from sluicegate.wiring.quotas import (
        default_rate_limit,
        embedding_share,
        open_quotas,
        rate_limit_overrides,
        sequence_share,
        warn_if_evicting,
    )
    from sluicegate.wiring.redis import greet_redis, open_redis, redis_client
    from sluicegate.wiring.registry import open_models
    from sluicegate.wiring.responses import open_response_store

_SUBMODULES = frozenset(
    {
        "cache",
        "capture",
        "engines",
        "entries",
        "inference",
        "keys",
        "media",
        "observability",
        "quotas",
        "reasoning",
        "redis",
        "registry",
        "responses",
    }
)
_NAMES = {
    "cache_config": "cache",
    "embedding_cache": "cache",
    "open_cache": "cache",
    "ttl_rule": "cache",
    "EmbedderFactory": "engines",
    "LocalFactory": "engines",
    "PoolFactory": "engines",
    "chat_template": "engines",
    "embedding_config": "engines",
    "embedding_model_folder": "engines",
    "engine_config": "engines",
    "local_factories": "engines",
    "reasoning_parser": "engines",
    "start_local_embedder": "engines",
    "start_local_engine": "engines",
    "start_pool": "engines",
    "tool_call_parser": "engines",
    "upstream_config": "engines",
    "watches_engine": "engines",
    "ModelsError": "entries",
    "check_embedding_name": "entries",
    "local_engine_configs": "entries",
    "model_entries": "entries",
    "uses_local_engine": "entries",
    "media_loader": "media",
    "admission": "inference",
    "budget_policy": "inference",
    "request_limits": "inference",
    "service_factory": "inference",
    "structured_limits": "inference",
    "timeouts": "inference",
    "open_key_store": "keys",
    "open_ledger": "keys",
    "usage_reader": "keys",
    "default_rate_limit": "quotas",
    "embedding_share": "quotas",
    "open_quotas": "quotas",
    "rate_limit_overrides": "quotas",
    "sequence_share": "quotas",
    "warn_if_evicting": "quotas",
    "greet_redis": "redis",
    "open_redis": "redis",
    "redis_client": "redis",
    "open_models": "registry",
    "open_response_store": "responses",
}


def __getattr__(name: str) -> Any:
    """The name, loaded now and kept, as an import at the top would have bound it."""
    if name in _SUBMODULES:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    elif name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "EmbedderFactory",
    "LocalFactory",
    "ModelsError",
    "PoolFactory",
    "admission",
    "budget_policy",
    "cache",
    "cache_config",
    "capture",
    "chat_template",
    "check_embedding_name",
    "default_rate_limit",
    "embedding_cache",
    "embedding_config",
    "embedding_model_folder",
    "embedding_share",
    "engine_config",
    "engines",
    "entries",
    "greet_redis",
    "inference",
    "keys",
    "local_engine_configs",
    "local_factories",
    "media",
    "media_loader",
    "model_entries",
    "observability",
    "open_cache",
    "open_key_store",
    "open_ledger",
    "open_models",
    "open_quotas",
    "open_redis",
    "open_response_store",
    "quotas",
    "rate_limit_overrides",
    "reasoning",
    "reasoning_parser",
    "redis",
    "redis_client",
    "registry",
    "request_limits",
    "responses",
    "sequence_share",
    "service_factory",
    "start_local_embedder",
    "start_local_engine",
    "start_pool",
    "structured_limits",
    "timeouts",
    "tool_call_parser",
    "ttl_rule",
    "upstream_config",
    "usage_reader",
    "uses_local_engine",
    "warn_if_evicting",
    "watches_engine",
]
