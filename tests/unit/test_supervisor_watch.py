"""The supervisor's watch over its workers' heartbeats (`supervisor._Watch`), over stand-in
workers that are real processes: which worker it kills for a stall, and which it leaves
alone. The heavy tier (test_supervisor.py, test_workers.py) sees only the end of it."""

from __future__ import annotations

import contextlib
import logging
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from sluicegate.counters import Board
from sluicegate.supervisor import _Watch

STALL = 10.0


@dataclass
class StandIn:
    """What the watch reads of a worker process, around a process that sleeps."""

    name: str
    process: subprocess.Popen[bytes]
    sentinel: object = field(default_factory=object)

    @property
    def pid(self) -> int:
        return self.process.pid

    def killed(self) -> bool:
        try:
            return self.process.wait(10) == -9
        except subprocess.TimeoutExpired:
            return False

    def alive(self) -> bool:
        return self.process.poll() is None


@pytest.fixture
def workers() -> Iterator[list[StandIn]]:
    sleeping = [sys.executable, "-c", "import time; time.sleep(120)"]
    stand_ins = [StandIn(f"worker-{i}", subprocess.Popen(sleeping)) for i in range(3)]
    yield stand_ins
    for stand_in in stand_ins:
        with contextlib.suppress(ProcessLookupError):
            stand_in.process.kill()
        stand_in.process.wait(10)


def watch_over(workers: list[StandIn], beats: list[float]) -> tuple[_Watch, dict[object, StandIn]]:
    heartbeats = Board.local(len(workers))
    heartbeats.values[:] = beats
    live = {w.sentinel: w for w in workers}
    return _Watch(workers, heartbeats, STALL, checked=time.monotonic()), live


def test_a_worker_silent_past_the_stall_timeout_is_killed_once_and_the_others_left(
    workers: list[StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    now = time.monotonic()
    watch, live = watch_over(workers, [now, now - STALL - 5, now - STALL + 5])
    with caplog.at_level(logging.ERROR, logger="sluicegate.supervisor"):
        watch.kill_stalled(live)
        assert workers[1].killed(), "a worker silent past the stall timeout was left running"
        assert workers[0].alive() and workers[2].alive()
        # Not again while its exit is on its way (its pid could be another process's by then).
        watch.kill_stalled(live)
    kills = [r.getMessage() for r in caplog.records if "killed" in r.getMessage()]
    assert len(kills) == 1 and "worker-1" in kills[0], kills
    assert watch.killed == {1}


def test_a_leaving_worker_or_one_that_has_exited_is_not_killed(workers: list[StandIn]) -> None:
    now = time.monotonic()
    watch, live = watch_over(workers, [math.inf, now - STALL - 5, now])
    del live[workers[1].sentinel]  # exited already: its pid is no longer its own
    watch.kill_stalled(live)
    assert all(w.alive() for w in workers)
    assert watch.killed == set()


def test_a_check_long_after_the_last_one_is_skipped_as_a_frozen_host(
    workers: list[StandIn],
) -> None:
    """The supervisor did not run either (a frozen container): every worker looks silent,
    and none is to blame. The next check, on time, sees the workers that did not beat since."""
    now = time.monotonic()
    watch, live = watch_over(workers, [now - STALL - 5] * 3)
    watch.checked = now - STALL  # more than half the stall timeout ago
    watch.kill_stalled(live)
    assert all(w.alive() for w in workers) and watch.killed == set()
    workers_beat = time.monotonic()
    watch.heartbeats.values[0] = watch.heartbeats.values[2] = workers_beat
    watch.kill_stalled(live)
    assert workers[1].killed() and watch.killed == {1}
    assert workers[0].alive() and workers[2].alive()


def test_the_watch_checks_four_times_per_stall_timeout_and_at_least_every_second() -> None:
    board = Board.local(1)
    assert _Watch([], board, 2.0).interval == 0.5
    assert _Watch([], board, 60.0).interval == 1.0
