"""Running the app under uvicorn (uvloop, httptools), one engine per process."""

from __future__ import annotations

import logging
import signal

import uvicorn

from sluicegate.app import create_app
from sluicegate.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then drain in-flight requests for `shutdown_timeout`."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        # One engine per process: several workers would each load the model.
        workers=1,
    )
    # uvicorn re-raises the signal it caught once it has drained. A SIGTERM that ended in a
    # clean drain is a normal stop for process managers, so it should exit 0, not -15.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.Server(config).run()
