"""`create_app(settings)`: the composition root.

Importing this module starts nothing. `create_app` lists the routes and the middleware (in
request order); the lifespan opens each subsystem in the running event loop (vLLM requires
it), in order: Redis, the keys, the quotas, the models and their engines, the cache and the
usage ledger, each by its module of `wiring`; it hands them to requests as one `AppState`,
and closes them in reverse.
"""

from __future__ import annotations

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
    admin_keys,
    admission,
    completions,
    embeddings,
    health,
    messages,
    models,
    responses,
    tokenize,
    usage,
)
from sluicegate.api.playground import playground_mount
from sluicegate.http.admin_guard import AdminGuardMiddleware
from sluicegate.http.admission import AdmissionMiddleware, ConnectionLimitMiddleware
from sluicegate.http.auth import ApiKeyMiddleware
from sluicegate.http.body_limits import BodyLimitMiddleware
from sluicegate.http.cache_hits import CacheHitMiddleware
from sluicegate.http.cors import cors_middleware
from sluicegate.http.errors import install_error_handlers
from sluicegate.http.request_id import RequestIdMiddleware
from sluicegate.http.state import Access, AppState
from sluicegate.http.telemetry import TelemetryMiddleware
from sluicegate.lifecycle import Lifecycle
from sluicegate.offload import ProcessOffload
from sluicegate.paths import METRICS_PATH, METRICS_PATHS, PLAYGROUND_PATH, PROBE_PATHS
from sluicegate.settings import Settings
from sluicegate.worker import Worker

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    engine_factory: wiring.engines.LocalFactory = wiring.engines.start_local_engine,
    lifecycle: Lifecycle | None = None,
    tracer_provider: TracerProvider | None = None,
    pool_factory: wiring.engines.PoolFactory = wiring.engines.start_pool,
    embedder_factory: wiring.engines.EmbedderFactory = wiring.engines.start_local_embedder,
    worker: Worker | None = None,
) -> FastAPI:
    """The app. `engine_factory` starts the in-process engine and `pool_factory` each pool of
    upstreams, for the models that need them (tests hand in fakes). `lifecycle` is shared
    with the server that drains it; tests may omit it. `worker` says which of several
    worker processes this app serves in, and what they share (by default: the only one).

    Traces go to `tracer_provider` when given, else where the `OTEL_*` environment says
    (nowhere when it says nothing)."""
    lifecycle = lifecycle or Lifecycle(drain_timeout=settings.shutdown_timeout)
    worker = worker or Worker()
    tracing = wiring.observability.tracing(tracer_provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, AppState]]:
        async with AsyncExitStack() as stack:
            if tracing is not None:
                stack.enter_context(tracing.activate())
            client = await wiring.redis.enter_redis(settings, stack)
            keys = await wiring.keys.enter_key_store(settings, stack, client)
            key_labels = wiring.observability.key_labels(settings)
            quotas = await wiring.quotas.enter_quotas(
                settings, stack, client, worker, keys, key_labels
            )
            started = time.monotonic()
            bounds = wiring.inference.admission(settings)
            models = await wiring.registry.open_models(
                settings, stack, engine_factory, pool_factory, embedder_factory, bounds
            )
            wiring.engines.watch_local_engines(
                settings, stack, models.local_engines(), lifecycle, worker
            )
            cache, embeddings = await wiring.cache.enter_cache(settings, stack, client)
            ledger = wiring.keys.enter_ledger(settings, stack, client, models)
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
            wiring.observability.watch_loop(stack)
            processes = ProcessOffload(
                settings.max_large_body_parses, settings.max_large_body_parses_per_key
            )
            stack.callback(processes.shutdown)
            state = AppState(
                models=models,
                cache=cache,
                embeddings=embeddings,
                quotas=quotas,
                responses=wiring.responses.open_response_store(settings, client),
                lifecycle=lifecycle,
                timeouts=wiring.inference.timeouts(settings),
                processes=processes,
                access=Access(
                    keys=settings.keyed,
                    admin_keys=settings.admin_api_keys is not None,
                    managed=settings.managed_keys,
                ),
                allow_runtime_lora=settings.allow_runtime_lora,
                lora_roots=settings.lora_root_folders,
                admission=bounds,
                allow_runtime_admission=settings.allow_runtime_admission,
                keys=keys,
                static_keys=settings.keyring(),
                ledger=ledger,
                usage=wiring.keys.usage_reader(settings, client),
                key_labels=key_labels,
                reasoning_seal=await wiring.reasoning.open_reasoning_seal(
                    settings, client, worker.reasoning_key
                ),
                media=wiring.media.media_loader(settings),
                capture=wiring.capture.enter_capture(settings, stack, models),
                objective=wiring.observability.service_objective(settings),
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
        admin_keys.router,
        admission.router,
        usage.router,
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
        middleware=middleware(settings, lifecycle, worker),
        lifespan=lifespan,
    )
    install_error_handlers(app)
    if tracing is not None:
        # Outermost of all: the server span covers every middleware below.
        tracing.instrument(app)
    return app


def middleware(
    settings: Settings, lifecycle: Lifecycle, worker: Worker | None = None
) -> list[Middleware]:
    """The middleware, in the order requests pass through it (the first is outermost)."""
    worker = worker or Worker()
    stack: list[Middleware] = []
    if origins := settings.cors_origins:
        # Outermost: a preflight is answered without a key, and every response below (a 401
        # or 429 too) carries the CORS headers a page needs to read it.
        stack.append(cors_middleware(origins))
    stack += [
        # Outermost otherwise, so even a 401 or 503 from the middleware below carries
        # X-Request-Id (and X-Sluicegate-Worker, of several).
        Middleware(RequestIdMiddleware, worker=None if worker.alone else worker.index),
        # Outside the API key and admission checks, so their refusals are counted and logged.
        Middleware(TelemetryMiddleware),
        # Before anything costs work: a connection past MAX_CONNECTIONS is refused here.
        Middleware(ConnectionLimitMiddleware),
    ]
    keys, admin = settings.api_keys, settings.admin_api_keys
    if keys is not None or admin is not None:
        closed = METRICS_PATHS if settings.metrics_require_auth else set()
        if settings.managed_keys:
            # Its series name keys and models: admin and scraper keys only (`api.health`).
            # The engine's scheduling state, for routers, names neither.
            closed = closed | {METRICS_PATH}
        open_paths = PROBE_PATHS - closed
        stack.append(
            Middleware(
                ApiKeyMiddleware,
                keyring=settings.keyring(),
                scrapers=settings.metrics_keyring(),
                open_paths=open_paths,
                # The page loads without a key; its API calls send the one typed into it.
                open_prefixes=(PLAYGROUND_PATH,) if settings.playground_enabled else (),
                # Admin keys alone guard the admin endpoints only (`http.admin_guard`).
                required=settings.keyed,
            )
        )
    stack += [
        # Before the body is read: an admin call that is refused costs no upload nor parse.
        Middleware(AdminGuardMiddleware),
        # The body is read whole before admission, so a slow upload holds no slot.
        Middleware(
            BodyLimitMiddleware,
            max_bytes=settings.max_request_bytes,
            read_timeout=settings.request_body_timeout,
            admin_max_bytes=settings.admin_max_request_bytes,
        ),
        Middleware(
            AdmissionMiddleware,
            lifecycle=lifecycle,
            max_in_flight=settings.max_in_flight,
            max_in_flight_per_key=settings.max_in_flight_per_key,
            tally=worker.tally,
        ),
        # Innermost: a cache hit is answered here, after every check above.
        Middleware(CacheHitMiddleware),
    ]
    return stack
