"""The process's serving state: requests in flight, and draining after SIGTERM.

Shared by the admission middleware (which counts requests and refuses new ones while
draining), `/ready` (which turns 503 while draining) and the server (which exits once the
drain is over, with `exit_code`). `watch_engine` starts the same drain when the engine dies,
with a non-zero exit code, so that a supervisor (Docker, compose, Kubernetes) restarts the
process instead of leaving it up answering 503s for ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ENGINE_DEATH_EXIT_CODE = 3
ENGINE_WATCH_INTERVAL = 1.0
"""Seconds between two engine health checks."""


@dataclass
class Lifecycle:
    drain_timeout: float
    in_flight: int = 0
    draining: bool = False
    drain_deadline: float = float("inf")
    exit_code: int = 0
    """What the process exits with after the drain: 0, or non-zero after a failure."""
    exit_reason: str = ""

    def begin_drain(self, exit_code: int = 0, reason: str = "") -> None:
        if exit_code and not self.exit_code:
            self.exit_code, self.exit_reason = exit_code, reason
        if not self.draining:
            self.draining = True
            self.drain_deadline = time.monotonic() + self.drain_timeout

    def drained(self) -> bool:
        """Draining, and either nothing is left in flight or the drain time is up."""
        return self.draining and (self.in_flight == 0 or time.monotonic() >= self.drain_deadline)

    async def watch_engine(
        self, check_health: Callable[[], Awaitable[None]], interval: float = ENGINE_WATCH_INTERVAL
    ) -> None:
        """Check the engine every `interval` seconds; the first failure starts the drain
        with `ENGINE_DEATH_EXIT_CODE`. Requests in flight end on their own (the engine's
        error ends them), new ones get 503 `shutting_down`."""
        while True:
            await asyncio.sleep(interval)
            try:
                await check_health()
            except Exception as exc:  # any failure: the engine cannot serve
                reason = f"the inference engine died ({type(exc).__name__})"
                logger.error(
                    "%s: draining (at most %g s), then exiting with code %d so that the "
                    "supervisor restarts the gateway",
                    reason,
                    self.drain_timeout,
                    ENGINE_DEATH_EXIT_CODE,
                )
                self.begin_drain(ENGINE_DEATH_EXIT_CODE, reason)
                return
