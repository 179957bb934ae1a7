"""Running the app under uvicorn (uvloop, httptools): the whole gateway in one process, or one
of several workers (`SLUICEGATE_WORKERS`, started by `supervisor.py`)."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from sluicegate import wiring
from sluicegate.app import create_app
from sluicegate.child_process import watch_parent
from sluicegate.http.connection import guarded_protocol
from sluicegate.lifecycle import Lifecycle
from sluicegate.ports import bind_socket
from sluicegate.settings import Settings
from sluicegate.worker import STOP_NOW, Worker

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

    def __init__(
        self,
        config: uvicorn.Config,
        lifecycle: Lifecycle,
        worker: bool = False,
        on_serving: Callable[[], None] | None = None,
        on_tick: Callable[[], None] | None = None,
        on_leaving: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.worker = worker
        """One of several workers: a stop signal only starts the drain (it may reach a worker
        twice, from the terminal or systemd and from the supervisor); the supervisor's
        `STOP_NOW` ends it."""
        self.on_serving = on_serving
        """Called once the server listens, its start-up done."""
        self.on_tick_done = on_tick
        """Called on each of the server's ticks (every 0.1 s), on the event loop: a worker's
        heartbeat, which stops when its loop does."""
        self.on_leaving = on_leaving
        """Called when its shutdown begins."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining:
            if not self.worker:
                super().handle_exit(sig, frame)
            return
        logger.info("draining: %d request(s) in flight", self.lifecycle.in_flight)
        self.lifecycle.begin_drain()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn listens on `sockets` once the lifespan has started: a worker still loading
        # takes no connections (the kernel spreads them over listening sockets only).
        await super().startup(sockets)
        if self.started and sockets is not None and not self.worker:
            # uvicorn says where it listens only on a socket it bound itself.
            host, port = self.config.host, self.config.port
            logger.info("listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
        if self.started and self.on_serving is not None:
            self.on_serving()

    def stop_now(self, sig: int, frame: FrameType | None) -> None:
        self.lifecycle.begin_drain()
        # Not through uvicorn's handler, which would raise the signal again on the way out.
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.on_tick_done is not None:
            self.on_tick_done()
        if self.lifecycle.drained():
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_leaving is not None:
            self.on_leaving()
        await super().shutdown(sockets)


def serve(
    settings: Settings, worker: Worker | None = None, sock: socket.socket | None = None
) -> int:
    """Serve until SIGINT/SIGTERM or the engine's death, then drain in-flight requests for
    `shutdown_timeout`. The process's exit code: 0, or 3 after the engine died. A worker
    serves on the supervisor's listening `sock`."""
    worker = worker or Worker()
    if worker.index == 0 and (warning := exposure_warning(settings)) is not None:
        logger.warning(warning)
    # Worker threads (tokenizing, truncating long inputs) run Python too; the event loop
    # waits for the GIL each time it wants it back, up to the switch interval: 1 ms instead
    # of 5 keeps every other request's wait small while one large request is worked on.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    lifecycle = Lifecycle(drain_timeout=settings.shutdown_timeout)
    engine_factory, embedder_factory = wiring.engines.local_factories(worker)
    app = create_app(
        settings,
        engine_factory=engine_factory,
        embedder_factory=embedder_factory,
        lifecycle=lifecycle,
        worker=worker,
    )
    server = DrainingServer(
        server_config(settings, app),
        lifecycle,
        worker=not worker.alone,
        on_serving=worker.now_serving,
        on_tick=worker.beat,
        on_leaving=worker.leaving,
    )
    if not worker.alone:
        signal.signal(STOP_NOW, server.stop_now)
    server.run(sockets=None if sock is None else [sock])
    if lifecycle.exit_code:
        logger.error("exiting with code %d: %s", lifecycle.exit_code, lifecycle.exit_reason)
    return lifecycle.exit_code


def run_worker(settings: Settings, worker: Worker) -> None:
    """A worker process's entry point (`supervisor`): serve on the gateway's port beside the
    other workers (SO_REUSEPORT), and exit with `serve`'s code. The socket listens only once
    the worker's start-up is done (`DrainingServer.startup`): listening before, a worker still
    loading took its share of new connections and held them in its backlog, unanswered, for as
    long as its start-up lasted."""
    from sluicegate.observability.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format, worker.index)
    sock = worker_socket(settings)
    # A supervisor killed outright leaves no one to stop the workers: each drains on its own.
    watch_parent(os.getppid(), _orphaned)
    sys.exit(serve(settings, worker, sock))


def worker_socket(settings: Settings) -> socket.socket:
    """A worker's socket on the gateway's port, beside the other workers' (SO_REUSEPORT):
    bound, and not listening until `DrainingServer.startup` has started the app."""
    return bind_socket(settings.host, settings.port, reuse_port=True)


def _orphaned() -> None:
    logger.error("the supervisor is gone: draining, then exiting")
    os.kill(os.getpid(), signal.SIGTERM)


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
        # Several workers are ours (`supervisor`): uvicorn's would each load the model.
        workers=1,
    )


def exposure_warning(settings: Settings) -> str | None:
    """A warning when the server is reachable from other machines and asks for no API key."""
    if settings.keyed or _is_loopback(settings.host):
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
