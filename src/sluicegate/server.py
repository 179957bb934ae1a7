"""Running the app under uvicorn (uvloop, httptools), one engine per process."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

from sluicegate.app import create_app
from sluicegate.lifecycle import Lifecycle
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain before its own shutdown.

    On the first SIGTERM (or Ctrl+C) the server keeps listening: `/ready` turns 503 and new
    inference requests get a 503 `shutting_down`, so load balancers move away, while the
    requests in flight finish. When none is left, or `shutdown_timeout` has passed, uvicorn
    shuts down: what is still running is cancelled, which aborts it in the engine. The
    process then exits 0. A second signal skips the rest of the drain.
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


def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then drain in-flight requests for `shutdown_timeout`."""
    lifecycle = Lifecycle(drain_timeout=settings.shutdown_timeout)
    app = create_app(settings, lifecycle=lifecycle)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=settings.log_level,
        # uvicorn's lines go through our handler, in `log_format`; the access log is ours.
        log_config=None,
        access_log=False,
        # The drain already waited; this only bounds the close of what is left.
        timeout_graceful_shutdown=1,
        # One engine per process: several workers would each load the model.
        workers=1,
    )
    DrainingServer(config, lifecycle).run()
