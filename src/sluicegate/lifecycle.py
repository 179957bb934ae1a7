"""The process's serving state: requests in flight, and draining after SIGTERM.

Shared by the admission middleware (which counts requests and refuses new ones while
draining), `/ready` (which turns 503 while draining) and the server (which exits once the
drain is over).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Lifecycle:
    drain_timeout: float
    in_flight: int = 0
    draining: bool = False
    drain_deadline: float = float("inf")

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.drain_deadline = time.monotonic() + self.drain_timeout

    def drained(self) -> bool:
        """Draining, and either nothing is left in flight or the drain time is up."""
        return self.draining and (self.in_flight == 0 or time.monotonic() >= self.drain_deadline)
