"""Warnings about a failing dependency, at most one line per interval.

A Redis outage fails every request; logging each would flood the logs exactly when they are
read. Each line says how many failures it stands for.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable


class ThrottledWarning:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last = -math.inf
        self._suppressed = 0

    def warn(self, message: str, *args: object) -> None:
        """Log `message % args` unless a line went out less than `interval` ago."""
        now = self._clock()
        if now - self._last < self._interval:
            self._suppressed += 1
            return
        self._logger.warning(message + " (%d more since the last warning)", *args, self._suppressed)
        self._last = now
        self._suppressed = 0
