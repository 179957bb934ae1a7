"""Which of the gateway's processes this is, and what it shares with the others.

With `SLUICEGATE_WORKERS` = 1 (the default) the gateway is one process, and `Worker()` says
so: counts in its own memory, an engine core of its own. With N > 1 the supervisor
(`supervisor.py`) starts N workers, each with a `Worker` naming its index, the counts in
shared memory (`counters`), and its client of each engine core the supervisor launched.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from sluicegate.counters import Board, LocalTally, Tally

if TYPE_CHECKING:
    from sluicegate.engine.vllm_core import CoreClient

logger = logging.getLogger(__name__)

GENERATIVE, EMBEDDING = "generate", "embed"
"""The in-process engines a worker may be a client of."""
CORE_DIED = signal.SIGUSR1
"""The supervisor to its workers: an engine core died (the workers drain, then exit 3)."""
STOP_NOW = signal.SIGUSR2
"""The supervisor to its workers: stop without waiting for the drain (a second SIGTERM)."""


@dataclass(frozen=True)
class Worker:
    index: int = 0
    count: int = 1
    tally: Tally = field(default_factory=LocalTally)
    """Requests and sequences in flight, overall and per API key, for the whole gateway."""
    cores: dict[str, CoreClient] = field(default_factory=dict)
    """This worker's client of each engine core the supervisor launched."""
    boards: dict[str, Board] = field(default_factory=dict)
    """Each engine's load, shared by the workers (`engine.vllm_load.LoadMeter`)."""
    serving: Connection | None = None
    """The write end of a pipe to the supervisor, told once this worker listens."""
    heartbeats: Board | None = None
    """Each worker's latest turn of its event loop (monotonic seconds; +inf: not watched),
    which the supervisor watches for a worker that stopped answering."""
    reasoning_key: bytes | None = field(default=None, repr=False)
    """A key the supervisor made for its workers to sign thoughts with alike, when neither
    `REASONING_KEY` nor Redis gives one (`wiring.reasoning`)."""

    _on_core_death: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def alone(self) -> bool:
        """The gateway is this one process."""
        return self.count == 1

    def on_core_death(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the supervisor says an engine core died (`CORE_DIED`): each
        engine client fails what it waits for, which its health check then reports."""
        self._on_core_death.append(callback)

    def now_serving(self) -> None:
        """Tell the supervisor that this worker's start-up is done and it takes connections."""
        self.beat()
        if self.serving is not None:
            self.serving.send(self.index)
            self.serving.close()

    def beat(self) -> None:
        """This worker's event loop has had a turn (`DrainingServer.on_tick`, every 0.1 s)."""
        if self.heartbeats is not None:
            self.heartbeats.values[self.index] = time.monotonic()

    def leaving(self) -> None:
        """Its shutdown has begun (closing connections and the engine client, with no more
        turns of the server's loop): the supervisor stops watching its beat."""
        if self.heartbeats is not None:
            self.heartbeats.values[self.index] = math.inf

    def core_died(self) -> None:
        logger.error("the supervisor reports an engine core's death")
        for callback in self._on_core_death:
            callback()
