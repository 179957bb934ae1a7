"""`create_app(settings)`: the composition root.

Importing this module starts nothing. `create_app` lists the routes and the middleware (in
request order); the lifespan opens Redis, the quotas, the cache and the engine in the running
event loop (vLLM requires it), hands them to requests as one `AppState`, and closes them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import APIRouter, FastAPI
from opentelemetry.sdk.trace import TracerProvider
from starlette.middleware import Middleware

from sluicegate import __version__, wiring
from sluicegate.api import (
    adapters,
    completions,
    embeddings,
    health,
    messages,
    models,
    responses,
    tokenize,
)
from sluicegate.api.playground import playground_mount
from sluicegate.http.admission import AdmissionMiddleware, ConnectionLimitMiddleware
from sluicegate.http.auth import ApiKeyMiddleware
from sluicegate.http.body_limits import BodyLimitMiddleware
from sluicegate.http.cache_hits import CacheHitMiddleware
from sluicegate.http.cors import cors_middleware
from sluicegate.http.errors import install_error_handlers
from sluicegate.http.request_id import RequestIdMiddleware
from sluicegate.http.state import Access, AppState
from sluicegate.http.telemetry import TelemetryMiddleware
from sluicegate.keys import ApiKeyring
from sluicegate.lifecycle import Lifecycle
from sluicegate.observability.loop_lag import watch_loop_lag
from sluicegate.observability.tracing import Tracing
from sluicegate.offload import ProcessOffload
from sluicegate.paths import METRICS_PATHS, PLAYGROUND_PATH, PROBE_PATHS
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    engine_factory: wiring.LocalFactory = wiring.start_local_engine,
    lifecycle: Lifecycle | None = None,
    tracer_provider: TracerProvider | None = None,
    pool_factory: wiring.PoolFactory = wiring.start_pool,
    embedder_factory: wiring.EmbedderFactory = wiring.start_local_embedder,
) -> FastAPI:
    """The app. `engine_factory` starts the in-process engine and `pool_factory` each pool of
    upstreams, for the models that need them (tests hand in fakes). `lifecycle` is shared
    with the server that drains it; tests may omit it.

    Traces go to `tracer_provider` when given, else where the `OTEL_*` environment says
    (nowhere when it says nothing)."""
    lifecycle = lifecycle or Lifecycle(drain_timeout=settings.shutdown_timeout)
    tracing = Tracing.from_env() if tracer_provider is None else Tracing(tracer_provider, False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, AppState]]:
        async with AsyncExitStack() as stack:
            if tracing is not None:
                stack.enter_context(tracing.activate())
            client = wiring.open_redis(settings)
            if client is not None:
                stack.push_async_callback(client.aclose)
                await wiring.greet_redis(client)
            quotas = await wiring.open_quotas(settings, client)
            stack.push_async_callback(quotas.limiter.close)
            started = time.monotonic()
            models = await wiring.open_models(
                settings, stack, engine_factory, pool_factory, embedder_factory
            )
            local_engines = models.local_engines()
            if local_engines and wiring.watches_engine(settings):

                async def check_local_engines() -> None:
                    for engine in local_engines:
                        await engine.check_health()

                # Stopped before the engines shut down, which it would take for a death.
                watcher = asyncio.create_task(lifecycle.watch_engine(check_local_engines))
                stack.callback(watcher.cancel)
            cache = await wiring.open_cache(settings, client)
            stack.push_async_callback(cache.close)
            embeddings = wiring.embedding_cache(settings, client, cache)
            stack.push_async_callback(embeddings.close)
            # Everything allocated so far (torch, transformers, the engine) lives until exit.
            # Freezing it keeps full garbage collections from walking it mid-stream, which
            # otherwise shows up as latency spikes under load.
            gc.collect()
            gc.freeze()
            logger.info(
                "ready in %.1f s: serving %s",
                time.monotonic() - started,
                ", ".join(
                    f"{m.name} (max_model_len={m.engine.max_model_len})"
                    for m in map(models.resolve_any, models.names())
                ),
            )
            lag_watch = asyncio.create_task(watch_loop_lag())
            stack.callback(lag_watch.cancel)
            processes = ProcessOffload(
                settings.max_large_body_parses, settings.max_large_body_parses_per_key
            )
            stack.callback(processes.shutdown)
            state = AppState(
                models=models,
                cache=cache,
                embeddings=embeddings,
                quotas=quotas,
                responses=wiring.open_response_store(settings, client),
                lifecycle=lifecycle,
                timeouts=wiring.timeouts(settings),
                processes=processes,
                access=Access(
                    keys=settings.api_keys is not None,
                    admin_keys=settings.admin_api_keys is not None,
                ),
                allow_runtime_lora=settings.allow_runtime_lora,
            )
            yield state.lifespan_state()
            logger.info("shutting down the engines")

    router = APIRouter()
    for routes in (
        completions.router,
        responses.router,
        messages.router,
        messages.counting,
        embeddings.router,
        models.router,
        adapters.router,
        tokenize.router,
        health.router,
    ):
        router.include_router(routes)
    if settings.playground_enabled:
        router.routes.append(playground_mount())
    app = FastAPI(
        title="sluicegate",
        version=__version__,
        description="OpenAI-compatible inference gateway over an in-process vLLM engine or "
        "remote OpenAI-compatible servers.",
        routes=router.routes,
        middleware=middleware(settings, lifecycle),
        lifespan=lifespan,
    )
    install_error_handlers(app)
    if tracing is not None:
        # Outermost of all: the server span covers every middleware below.
        tracing.instrument(app)
    return app


def middleware(settings: Settings, lifecycle: Lifecycle) -> list[Middleware]:
    """The middleware, in the order requests pass through it (the first is outermost)."""
    stack: list[Middleware] = []
    if origins := settings.cors_origins:
        # Outermost: a preflight is answered without a key, and every response below (a 401
        # or 429 too) carries the CORS headers a page needs to read it.
        stack.append(cors_middleware(origins))
    stack += [
        # Outermost otherwise, so even a 401 or 503 from the middleware below carries
        # X-Request-Id.
        Middleware(RequestIdMiddleware),
        # Outside the API key and admission checks, so their refusals are counted and logged.
        Middleware(TelemetryMiddleware),
        # Before anything costs work: a connection past MAX_CONNECTIONS is refused here.
        Middleware(ConnectionLimitMiddleware),
    ]
    keys, admin = settings.api_keys, settings.admin_api_keys
    if keys is not None or admin is not None:
        open_paths = PROBE_PATHS - (METRICS_PATHS if settings.metrics_require_auth else set())
        stack.append(
            Middleware(
                ApiKeyMiddleware,
                keyring=ApiKeyring.of(
                    None if keys is None else keys.get_secret_value(),
                    None if admin is None else admin.get_secret_value(),
                ),
                open_paths=open_paths,
                # The page loads without a key; its API calls send the one typed into it.
                open_prefixes=(PLAYGROUND_PATH,) if settings.playground_enabled else (),
                # Admin keys alone guard the admin endpoints only (`api.deps.AdminDep`).
                required=keys is not None,
            )
        )
    stack += [
        # The body is read whole before admission, so a slow upload holds no slot.
        Middleware(
            BodyLimitMiddleware,
            max_bytes=settings.max_request_bytes,
            read_timeout=settings.request_body_timeout,
        ),
        Middleware(
            AdmissionMiddleware,
            lifecycle=lifecycle,
            max_in_flight=settings.max_in_flight,
            max_in_flight_per_key=settings.max_in_flight_per_key,
        ),
        # Innermost: a cache hit is answered here, after every check above.
        Middleware(CacheHitMiddleware),
    ]
    return stack
