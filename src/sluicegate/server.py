"""Running the app under uvicorn (uvloop, httptools), one engine per process."""

from __future__ import annotations

import ipaddress
import logging
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from sluicegate.app import create_app
from sluicegate.http.connection import guarded_protocol
from sluicegate.lifecycle import Lifecycle
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL = 0.001


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain before its own shutdown.

    On the first SIGTERM (or Ctrl+C) the server keeps listening: `/ready` turns 503 and new
    inference requests get a 503 `shutting_down`, so load balancers move away, while the
    requests in flight finish. When none is left, or `shutdown_timeout` has passed, uvicorn
    shuts down: what is still running is cancelled, which aborts it in the engine. A second
    signal skips the rest of the drain. The engine's death starts the same drain (see
    `Lifecycle.watch_engine`).
    """

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle):
        super().__init__(config)
        self.lifecycle = lifecycle

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining:
            super().handle_exit(sig, frame)
            return
        logger.info("draining: %d request(s) in flight", self.lifecycle.in_flight)
        self.lifecycle.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        if self.lifecycle.drained():
            return True
        return await super().on_tick(counter)


def serve(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM or the engine's death, then drain in-flight requests for
    `shutdown_timeout`. The process's exit code: 0, or 3 after the engine died."""
    if (warning := exposure_warning(settings)) is not None:
        logger.warning(warning)
    # Worker threads (tokenizing, truncating long inputs) run Python too; the event loop
    # waits for the GIL each time it wants it back, up to the switch interval: 1 ms instead
    # of 5 keeps every other request's wait small while one large request is worked on.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    lifecycle = Lifecycle(drain_timeout=settings.shutdown_timeout)
    app = create_app(settings, lifecycle=lifecycle)
    DrainingServer(server_config(settings, app), lifecycle).run()
    if lifecycle.exit_code:
        logger.error("exiting with code %d: %s", lifecycle.exit_code, lifecycle.exit_reason)
    return lifecycle.exit_code


def server_config(settings: Settings, app: FastAPI) -> uvicorn.Config:
    """uvicorn's configuration: the connection limits are its own settings where it has
    them, and `http.connection` where it has not (or where its own serves nobody under a
    burst: `limit_concurrency`)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guarded_protocol(
            head_timeout=settings.request_head_timeout,
            write_timeout=settings.stream_stall_timeout,
            max_connections=settings.max_connections,
        ),
        lifespan="on",
        log_level=settings.log_level,
        # uvicorn's lines go through our handler, in `log_format`; the access log is ours.
        log_config=None,
        access_log=False,
        backlog=settings.backlog,
        timeout_keep_alive=settings.keep_alive_timeout,
        # The drain already waited; this only bounds the close of what is left.
        timeout_graceful_shutdown=1,
        # One engine per process: several workers would each load the model.
        workers=1,
    )


def exposure_warning(settings: Settings) -> str | None:
    """A warning when the server is reachable from other machines and asks for no API key."""
    if settings.api_keys is not None or _is_loopback(settings.host):
        return None
    return (
        f"listening on {settings.host}:{settings.port}, reachable from other machines, with no "
        "API keys: anyone who reaches this port can use the model. Set SLUICEGATE_API_KEYS, "
        "or bind 127.0.0.1 (SLUICEGATE_HOST) behind a proxy that authenticates."
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to any interface
