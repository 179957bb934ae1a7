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
        level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._level = level
        self._interval = interval
        self._clock = clock
        self._last = -math.inf
        self._suppressed = 0

    def warn(self, message: str, *args: object, exc_info: bool = False) -> None:
        """Log `message % args` (at `level`; with the exception being handled: `exc_info`)
        unless a line went out less than `interval` ago."""
        now = self._clock()
        if now - self._last < self._interval:
            self._suppressed += 1
            return
        self._logger.log(
            self._level,
            message + " (%d more since the last warning)",
            *args,
            self._suppressed,
            exc_info=exc_info,
        )
        self._last = now
        self._suppressed = 0
