"""From `Settings` to what each package takes, and opening what the lifespan owns.

The packages below never see `Settings`: each takes its own small config object, built here
and nowhere else. The `open_*` functions open Redis, the quotas, the cache and the engine
for the lifespan in `app.py`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import cast

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from sluicegate.cache.embedding_cache import EmbeddingCache, EmbeddingCacheConfig
from sluicegate.cache.invalidation import InvalidationListener
from sluicegate.cache.near import NearCache
from sluicegate.cache.response_cache import CacheConfig, Coherence, ResponseCache
from sluicegate.cache.store import CacheStore, MemoryStore, RedisStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.conversation.store import (
    MemoryResponseStore,
    RedisResponseStore,
    ResponseStore,
    StoreConfig,
)
from sluicegate.deadline import Deadline
from sluicegate.engine.lora import parse_lora_modules
from sluicegate.engine.model import model_identity, resolve_model, shipped_template
from sluicegate.engine.protocol import EmbeddingEngine, EngineClient
from sluicegate.engine.upstream.config import (
    AffinityConfig,
    BreakerConfig,
    PoolConfig,
    RetryConfig,
    UpstreamConfig,
)
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.engine.vllm_embeddings import EmbeddingConfig
from sluicegate.engine.vllm_engine import EngineConfig, LoraConfig, VLLMEngine
from sluicegate.errors import GatewayError
from sluicegate.http.state import Timeouts
from sluicegate.inference.budget import BudgetPolicy
from sluicegate.inference.embeddings import EmbeddingLimits, EmbeddingService
from sluicegate.inference.load_limits import LoadLimits
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig
from sluicegate.inference.run import RequestLimits
from sluicegate.inference.service import CompletionService
from sluicegate.inference.structured import StructuredLimits
from sluicegate.keys import key_id
from sluicegate.models.config import (
    ModelEntry,
    ModelPrice,
    ModelRateLimit,
    ModelsFileError,
    UpstreamEntry,
    check_entries,
    parse_models_file,
)
from sluicegate.models.registry import LocalEngine, ModelRegistry, ServiceFactory
from sluicegate.models.served import ServedEmbedder, ServedModel
from sluicegate.observability.key_label import KeyLabels
from sluicegate.prices import Price
from sluicegate.quota.budgets import BudgetKeeper
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.quotas import ModelQuota, Quotas, no_policies
from sluicegate.quota.redis_limiter import RedisRateLimiter
from sluicegate.quota.share import KeyShare, SequenceShare
from sluicegate.quota.window import RateLimit, RateLimiter
from sluicegate.settings import Settings
from sluicegate.tenancy.ledger import UsageLedger
from sluicegate.tenancy.price_memo import PriceMemo
from sluicegate.tenancy.store import KeyStore
from sluicegate.tenancy.usage import UsageReader
from sluicegate.wire.embeddings import MAX_INPUTS
from sluicegate.wire.tools import ToolLimits
from sluicegate.worker import EMBEDDING, GENERATIVE, Worker

logger = logging.getLogger(__name__)


# ---- config objects ------------------------------------------------------------------------


def request_limits(settings: Settings) -> RequestLimits:
    return RequestLimits(
        max_messages=settings.max_messages,
        max_prompts=settings.max_prompts,
        max_n=settings.max_n,
        max_tokens=settings.max_tokens_limit,
        max_stop_sequences=settings.max_stop_sequences,
        max_stop_length=settings.max_stop_length,
        max_sequences=settings.max_sequences_per_request,
        tools=ToolLimits(settings.max_tools, settings.max_tools_bytes),
    )


def load_limits(settings: Settings, engine: EngineClient) -> LoadLimits:
    limits = LoadLimits(
        max_waiting=settings.max_engine_waiting,
        max_running=settings.max_engine_running,
        max_kv_cache_usage=settings.max_kv_cache_usage,
    )
    if limits.any and engine.load() is None:
        logger.warning(
            "MAX_ENGINE_WAITING, MAX_ENGINE_RUNNING and MAX_KV_CACHE_USAGE read the in-process "
            "engine's scheduler; upstreams report none, so they bound nothing here"
        )
    return limits


def structured_limits(settings: Settings) -> StructuredLimits:
    return StructuredLimits(
        max_schema_bytes=settings.max_schema_bytes,
        max_schema_depth=settings.max_schema_depth,
        max_regex_length=settings.max_regex_length,
        max_grammar_bytes=settings.max_grammar_bytes,
        max_choices=settings.max_choices,
        max_choice_length=settings.max_choice_length,
        compact_whitespace=settings.structured_compact_whitespace,
    )


def budget_policy(settings: Settings) -> BudgetPolicy:
    default_max = settings.budget_default_max_tokens
    if settings.max_tokens_limit is not None:
        default_max = min(default_max, settings.max_tokens_limit)
    return BudgetPolicy(
        reserve_ratio=settings.budget_reserve_ratio,
        default_max_tokens=default_max,
        min_completion_tokens=settings.budget_min_completion_tokens,
        overflow=settings.max_tokens_overflow,
        chat_truncation=settings.truncation,
        completion_truncation=settings.completion_truncation,
    )


def ttl_rule(settings: Settings) -> TtlRule:
    return TtlRule(
        base=settings.cache_ttl_seconds,
        minimum=settings.cache_ttl_min_seconds,
        maximum=settings.cache_ttl_max_seconds,
        fast_below=settings.cache_ttl_fast_latency,
        slow_above=settings.cache_ttl_slow_latency,
        fast_factor=settings.cache_ttl_fast_factor,
        slow_factor=settings.cache_ttl_slow_factor,
        jitter=settings.cache_ttl_jitter,
    )


def cache_config(settings: Settings) -> CacheConfig:
    return CacheConfig(
        policy=settings.cache_policy,
        prefix=settings.redis_key_prefix,
        # Tenants apart unless sharing is asked for; without keys everyone is `anonymous`.
        per_key=settings.keyed and not settings.cache_shared_across_keys,
        max_entry_bytes=settings.cache_max_entry_bytes,
        flight_timeout=settings.cache_flight_timeout,
        retry_interval=settings.cache_retry_interval,
    )


def default_rate_limit(settings: Settings) -> RateLimit:
    return RateLimit(settings.rate_limit_requests_per_minute, settings.rate_limit_tokens_per_minute)


def rate_limit_overrides(settings: Settings) -> dict[str, RateLimit]:
    return {
        key: RateLimit(o.requests_per_minute, o.tokens_per_minute)
        for key, o in settings.rate_limit_overrides.items()
    }


def sequence_share(settings: Settings, worker: Worker | None = None) -> SequenceShare:
    """Each API key's share of the engine's sequences: half of them unless set, and no
    bound without API keys (every request is then the same anonymous key). Counted where
    every worker counts (`worker.tally`)."""
    per_key = settings.max_sequences_per_key
    if not settings.keyed:
        per_key = None
    elif per_key is None:
        per_key = max(1, settings.max_num_seqs // 2)
    return SequenceShare(
        per_key=per_key,
        prioritize=settings.scheduling_policy == "priority",
        priorities=dict(settings.key_priorities),
        keyed=settings.keyed,
        tally=(worker or Worker()).tally,
    )


def embedding_share(settings: Settings, worker: Worker | None = None) -> KeyShare:
    """Each API key's share of the embedding engine, in inputs: 4096 (two requests of the
    most inputs) unless set, and no bound without API keys."""
    per_key = settings.max_embedding_inputs_per_key
    if not settings.keyed:
        per_key = None
    elif per_key is None:
        per_key = 2 * MAX_INPUTS
    return KeyShare(per_key=per_key, tally=(worker or Worker()).tally)


def timeouts(settings: Settings) -> Timeouts:
    return Timeouts(
        request=settings.request_timeout,
        stream_stall=settings.stream_stall_timeout,
        ping_after=settings.stream_ping_after,
    )


def engine_config(settings: Settings, model: str) -> EngineConfig:
    """The engine's configuration; `model` is the resolved folder or hub id."""
    lora = None
    if settings.lora_enabled:
        lora = LoraConfig(settings.max_loras, settings.max_lora_rank, settings.max_cpu_loras)
    return EngineConfig(
        model=model,
        served_model_name=settings.model_name,
        revision=settings.revision,
        trust_remote_code=settings.trust_remote_code,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        data_parallel_size=settings.data_parallel_size,
        distributed_executor_backend=settings.distributed_executor_backend,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        scheduling_policy=settings.scheduling_policy,
        enforce_eager=settings.enforce_eager,
        cpu_kvcache_space_gib=settings.cpu_kvcache_space_gib,
        structured_compact_whitespace=settings.structured_compact_whitespace,
        chat_template=chat_template(settings),
        tool_call_parser=tool_call_parser(settings),
        lora=lora,
    )


def upstream_config(settings: Settings, entry: ModelEntry | None = None) -> UpstreamConfig:
    """A pool's configuration: `entry`'s upstreams, key, tokenizer and model from the models
    file, and everything else from the `SLUICEGATE_UPSTREAM_*` settings, which are the whole
    of it for `UPSTREAM_URLS` (no entry)."""
    key = (
        None if settings.upstream_api_key is None else settings.upstream_api_key.get_secret_value()
    )
    urls = tuple(settings.upstreams)
    tokenizer, model, max_model_len = settings.tokenizer, None, settings.max_model_len
    if entry is not None:
        urls = tuple((u.url, u.weight) for u in entry.upstreams)
        key = None if entry.api_key_env is None else os.environ.get(entry.api_key_env)
        tokenizer, model = entry.tokenizer, entry.upstream_model
        max_model_len = entry.max_model_len or settings.max_model_len
    affinity = None
    if settings.upstream_prefix_affinity:
        affinity = AffinityConfig(settings.upstream_affinity_chars, settings.upstream_affinity_load)
    return UpstreamConfig(
        urls=urls,
        api_key=key,
        pool=PoolConfig(
            max_connections=settings.upstream_max_connections,
            max_keepalive=settings.upstream_max_keepalive_connections,
            keepalive_expiry=settings.upstream_keepalive_expiry,
            http2=settings.upstream_http2,
            transport=settings.upstream_transport,
            connect_timeout=settings.upstream_connect_timeout,
            read_timeout=settings.upstream_read_timeout,
            write_timeout=settings.upstream_write_timeout,
            pool_timeout=settings.upstream_pool_timeout,
        ),
        breaker=BreakerConfig(
            failures=settings.upstream_breaker_failures,
            error_ratio=settings.upstream_breaker_error_ratio,
            window=settings.upstream_breaker_window,
            open_seconds=settings.upstream_breaker_open_seconds,
        ),
        retry=RetryConfig(
            max_retries=settings.upstream_max_retries,
            backoff=settings.upstream_retry_backoff,
            backoff_max=settings.upstream_retry_backoff_max,
            retry_after_max=settings.upstream_retry_after_max,
            budget=settings.upstream_retry_budget,
            burst=settings.upstream_retry_burst,
        ),
        affinity=affinity,
        health_path=settings.upstream_health_path,
        health_interval=settings.upstream_health_interval,
        health_failures=settings.upstream_health_failures,
        start_timeout=settings.upstream_start_timeout,
        tokenizer=tokenizer,
        served_model_name=settings.served_model_name if entry is None else entry.name,
        model=model,
        max_model_len=max_model_len,
        pass_through=settings.upstream_pass_through,
    )


def chat_template(settings: Settings) -> str | None:
    """The template text that replaces the model's own: the setting's file, else for the
    bundled model the shipped one (it renders tools); None keeps the model's."""
    if settings.chat_template is not None:
        return settings.chat_template.read_text(encoding="utf-8")
    return shipped_template() if settings.model is None else None


def tool_call_parser(settings: Settings) -> str | None:
    """The tool parser for `auto`: the setting (`none` for none), else `hermes` for the
    bundled model, whose shipped template asks for Hermes-style calls."""
    name = settings.tool_call_parser
    if name is None:
        return "hermes" if settings.model is None else None
    return None if name.lower() == "none" else name


# ---- what the lifespan opens ---------------------------------------------------------------


# A connection that does not come within this long is a failed operation (each user's own,
# shorter timeout usually ends the wait first); so is a socket that stops answering.
_REDIS_BACKSTOP_SECONDS = 1.0


def open_redis(settings: Settings) -> redis.asyncio.Redis | None:
    """One client (one bounded connection pool) for everything the gateway keeps in Redis."""
    if settings.redis_url is None:
        return None
    return redis_client(settings.redis_url.get_secret_value(), settings.redis_max_connections)


def redis_client(url: str, max_connections: int) -> redis.asyncio.Redis:
    """A client over a pool of at most `max_connections`, where an operation waits for a
    free connection rather than opening one more (BlockingConnectionPool).

    Each user bounds its own operations with a timeout; the socket timeout is a backstop.
    One retry lets a request ride over a connection that died with a Redis restart."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=_REDIS_BACKSTOP_SECONDS,
        socket_connect_timeout=_REDIS_BACKSTOP_SECONDS,
        socket_timeout=_REDIS_BACKSTOP_SECONDS,
        retry=Retry(NoBackoff(), 1),
    )
    return redis.asyncio.Redis.from_pool(pool)


async def greet_redis(client: redis.asyncio.Redis, wait: float = 2.0) -> None:
    """Open the first connection at start-up (TLS and AUTH included, which can take longer
    than one operation's timeout) and say whether Redis answers. Start-up goes on either way:
    the cache and rate limits fail open until Redis is back."""
    kwargs = client.connection_pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    try:
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        await Deadline(wait).run(client.ping())
    except (TimeoutError, OSError, RedisError) as exc:
        logger.warning("redis at %s does not answer (%s): serving without it", where, exc)
    else:
        logger.info("redis at %s answers", where)


async def open_quotas(
    settings: Settings,
    client: redis.asyncio.Redis | None,
    worker: Worker | None = None,
    keys: KeyStore | None = None,
    labels: KeyLabels | None = None,
) -> Quotas:
    """Rate limits in Redis when there is one (shared by replicas), else in this process;
    with managed `keys`, their own limits, priorities and budgets (kept beside the limits).

    `RATE_LIMIT_REDIS_URL` gives them a Redis of their own (closed with the limiter);
    either way, the Redis they use is checked for an eviction policy that could drop them.
    Of N workers, each enforces 1/N of what a process enforces in its own memory."""
    worker = worker or Worker()
    budgets = None
    limiter: RateLimiter
    own = settings.rate_limit_redis_url
    if own is not None:
        client = redis_client(own.get_secret_value(), settings.redis_max_connections)
        await greet_redis(client)
    if client is not None:
        # What this process may admit by itself while Redis does not answer.
        local_share = settings.rate_limit_local_share / worker.count
        limiter = RedisRateLimiter(
            client,
            prefix=settings.redis_key_prefix,
            op_timeout=settings.rate_limit_redis_timeout,
            local_share=local_share,
            owns_client=own is not None,
        )
        await warn_if_evicting(client)
        if keys is not None:
            budgets = BudgetKeeper(
                client,
                prefix=settings.redis_key_prefix,
                op_timeout=settings.rate_limit_redis_timeout,
                local_share=local_share,
                labels=labels or KeyLabels(settings.metrics_max_keys),
            )
    else:
        limiter = MemoryRateLimiter(share=1 / worker.count)
    return Quotas(
        limiter,
        default=default_rate_limit(settings),
        overrides=rate_limit_overrides(settings),
        share=sequence_share(settings, worker),
        embedding_share=embedding_share(settings, worker),
        policies=no_policies if keys is None else keys.policy,
        budgets=budgets,
        admin=RateLimit(settings.admin_requests_per_minute),
    )


def open_key_store(settings: Settings, client: redis.asyncio.Redis | None) -> KeyStore | None:
    """Managed keys (`MANAGED_KEYS`, which the settings allow only with Redis), or None. A new
    key never takes the id of a key of the settings."""
    if not settings.managed_keys or client is None:
        return None
    ring = settings.keyring()
    return KeyStore(
        client,
        settings.redis_key_prefix,
        reserved_ids=[key_id(d) for d in ring.digests],
        sync_interval=settings.key_sync_interval,
    )


def open_ledger(
    settings: Settings, client: redis.asyncio.Redis | None, models: ModelRegistry
) -> UsageLedger | None:
    """The usage ledger in Redis (`USAGE_LEDGER`), or None without Redis."""
    if not settings.usage_ledger or client is None:
        return None
    return UsageLedger(
        client,
        settings.redis_key_prefix,
        price_of=PriceMemo(models.price_of).price,
        flush_interval=settings.usage_flush_interval,
        retention_days=settings.usage_retention_days,
        give_up_after=settings.usage_give_up_seconds,
    )


def usage_reader(settings: Settings, client: redis.asyncio.Redis | None) -> UsageReader | None:
    if not settings.usage_ledger or client is None:
        return None
    return UsageReader(client, settings.redis_key_prefix)


async def warn_if_evicting(client: redis.asyncio.Redis, wait: float = 2.0) -> None:
    """Warn when Redis may evict the rate-limit keys: under an allkeys-* policy any key may
    go, and a key's limit with it. Their keys have no TTL, so volatile-* policies keep them."""
    try:
        reply = await Deadline(wait).run(client.config_get("maxmemory-policy"))
        policy = reply.get("maxmemory-policy")
    except (TimeoutError, OSError, RedisError) as exc:
        # Managed Redis services often refuse CONFIG; not knowing is no reason to stop.
        logger.info("could not read redis maxmemory-policy (%s)", exc)
        return
    if isinstance(policy, bytes):
        policy = policy.decode()
    if isinstance(policy, str) and policy.startswith("allkeys-"):
        logger.warning(
            "redis maxmemory-policy is %s: under memory pressure it may evict rate-limit "
            "keys, and lift those limits. Use volatile-lru (every cache key has a TTL, the "
            "rate-limit keys have none), or give the rate limits a Redis of their own with "
            "SLUICEGATE_RATE_LIMIT_REDIS_URL",
            policy,
        )


async def open_cache(settings: Settings, client: redis.asyncio.Redis | None) -> ResponseCache:
    """The response cache on Redis when there is one (shared by replicas), else in memory;
    with a near cache in front, kept true to Redis by Redis's reports of changes. Each run
    says which model, and which weights, its key is for (`Run.model`, `Run.identity`)."""
    store: CacheStore = (
        MemoryStore(settings.cache_memory_max_bytes)
        if client is None
        else RedisStore(client, op_timeout=settings.cache_redis_timeout)
    )
    near = NearCache(settings.cache_near_max_bytes, settings.cache_max_entry_bytes)
    coherence: Coherence | None = None
    if client is not None and near.max_bytes:
        listener = InvalidationListener(
            client,
            near,
            prefix=f"{settings.redis_key_prefix}:cache:",
            max_lag=settings.cache_near_max_lag,
            retry_interval=settings.cache_retry_interval,
        )
        listener.start()
        coherence = listener
    config = cache_config(settings)
    ttl = TtlPolicy(ttl_rule(settings))
    return ResponseCache(store, ttl, config, near, coherence)


def open_response_store(settings: Settings, client: redis.asyncio.Redis | None) -> ResponseStore:
    """Stored responses in Redis when there is one (shared by replicas, kept across restarts),
    else in this process, bounded in bytes."""
    config = StoreConfig(
        ttl=settings.responses_ttl_seconds,
        max_entry_bytes=settings.responses_max_entry_bytes,
        max_key_bytes=settings.responses_max_bytes_per_key,
    )
    if client is None:
        return MemoryResponseStore(config, settings.responses_memory_max_bytes)
    return RedisResponseStore(
        client,
        config,
        prefix=settings.redis_key_prefix,
        op_timeout=settings.responses_redis_timeout,
    )


# ---- the model registry ----------------------------------------------------------------

LocalFactory = Callable[[Settings], Awaitable[EngineClient]]
"""Starts the in-process engine (tests hand in a fake one)."""
PoolFactory = Callable[[UpstreamConfig], Awaitable[EngineClient | EmbeddingEngine]]
"""Starts a pool of upstreams (tests hand in fakes)."""
EmbedderFactory = Callable[[Settings], Awaitable[EmbeddingEngine]]
"""Starts the in-process embedding engine (tests hand in a fake one)."""


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


async def start_local_engine(settings: Settings) -> EngineClient:
    """The default local factory of `create_app`: the in-process vLLM engine."""
    model = resolve_model(settings.model, settings.model_cache_dir)
    return await VLLMEngine.start(engine_config(settings, model))


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


def local_factories(worker: Worker) -> tuple[LocalFactory, EmbedderFactory]:
    """The factories of the in-process engines: an engine core of its own for a single
    process, else a client of the core the supervisor launched for the workers."""
    if worker.alone:
        return start_local_engine, start_local_embedder

    async def attach_engine(settings: Settings) -> EngineClient:
        from sluicegate.engine.vllm_load import LoadMeter

        model = resolve_model(settings.model, settings.model_cache_dir)
        config = engine_config(settings, model)
        meter = LoadMeter(cores=config.data_parallel_size, board=worker.boards[GENERATIVE])
        engine = await VLLMEngine.start(config, core=worker.cores[GENERATIVE], meter=meter)
        worker.on_core_death(engine.abandon)
        return engine

    async def attach_embedder(settings: Settings) -> EmbeddingEngine:
        from sluicegate.engine.vllm_embeddings import VLLMEmbedder

        embedder = await VLLMEmbedder.start(
            embedding_config(settings), core=worker.cores[EMBEDDING]
        )
        worker.on_core_death(embedder.abandon)
        return embedder

    return attach_engine, attach_embedder


async def start_pool(config: UpstreamConfig) -> EngineClient | EmbeddingEngine:
    """The default pool factory of `create_app`: the upstreams of one model."""
    return await UpstreamEngine.start(config)


async def start_local_embedder(settings: Settings) -> EmbeddingEngine:
    """The default embedder factory of `create_app`: an in-process vLLM pooling engine."""
    from sluicegate.engine.vllm_embeddings import VLLMEmbedder

    return await VLLMEmbedder.start(embedding_config(settings))


def embedding_model_folder(settings: Settings) -> str:
    """`EMBEDDING_MODEL` resolved: `bundled` is the prepared bundled model's folder."""
    assert settings.embedding_model is not None
    name = None if settings.embedding_model == "bundled" else settings.embedding_model
    return resolve_model(name, settings.model_cache_dir)


def embedding_config(settings: Settings) -> EmbeddingConfig:
    name = settings.embedding_name
    assert name is not None
    return EmbeddingConfig(
        model=embedding_model_folder(settings),
        served_model_name=name,
        revision=settings.revision,
        trust_remote_code=settings.trust_remote_code,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.embedding_memory_fraction,
        cpu_kvcache_space_gib=settings.embedding_cpu_kvcache_space_gib,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enforce_eager=settings.enforce_eager,
    )


def embedding_cache(
    settings: Settings, client: redis.asyncio.Redis | None, cache: ResponseCache
) -> EmbeddingCache:
    """Inputs' embeddings in the response cache's store, with their own TTL."""
    config = EmbeddingCacheConfig(
        prefix=settings.redis_key_prefix,
        ttl_seconds=settings.embedding_cache_ttl_seconds,
        per_key=cache_config(settings).per_key,
        retry_interval=settings.cache_retry_interval,
    )
    return EmbeddingCache(cache.store, config)


async def open_models(
    settings: Settings,
    stack: AsyncExitStack,
    local_factory: LocalFactory = start_local_engine,
    pool_factory: PoolFactory = start_pool,
    embedder_factory: EmbedderFactory = start_local_embedder,
) -> ModelRegistry:
    """Start every engine the models need (at once), register their shutdowns on `stack`,
    load the start-up adapters, and build the registry."""
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
    factory = service_factory(settings)
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


def service_factory(settings: Settings) -> ServiceFactory:
    """Builds each served model's service. The admission state that models an engine's queue
    and load (`PrefillQueue`, `LoadLimits`) is one per engine, shared by its models."""
    per_engine: dict[int, tuple[PrefillQueue, LoadLimits]] = {}

    def build(
        engine: EngineClient, name: str, identity: str, adapter: str | None
    ) -> CompletionService:
        shared = per_engine.get(id(engine))
        if shared is None:
            queue = PrefillQueue(QueueConfig(objective=settings.ttft_objective))
            shared = per_engine[id(engine)] = (queue, load_limits(settings, engine))
        return CompletionService(
            engine,
            name,
            request_limits(settings),
            budget_policy(settings),
            structured_limits(settings),
            shared[0],
            shared[1],
            identity=identity,
            adapter=adapter,
        )

    return build


def watches_engine(settings: Settings) -> bool:
    """Whether the gateway exits when its in-process engine dies. Upstreams come and go on
    their own: `/ready` says when none is healthy, and the gateway keeps running."""
    return settings.exit_on_engine_death
