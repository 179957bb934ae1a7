"""A worker's bookkeeping for the supervisor (`worker.Worker`): its heartbeat, its word that
it serves, its leaving, and an engine core's death passed on to its engine clients."""

from __future__ import annotations

import math
import multiprocessing
import time

from sluicegate.counters import Board
from sluicegate.worker import Worker


def test_a_beat_writes_this_workers_own_slot_with_the_time() -> None:
    heartbeats = Board.local(3)
    worker = Worker(index=1, count=3, heartbeats=heartbeats)
    before = time.monotonic()
    worker.beat()
    assert heartbeats.values[0] == heartbeats.values[2] == 0.0
    assert before <= heartbeats.values[1] <= time.monotonic()


def test_a_leaving_worker_is_no_longer_watched() -> None:
    heartbeats = Board.local(2)
    worker = Worker(index=0, count=2, heartbeats=heartbeats)
    worker.beat()
    worker.leaving()
    # +inf: the supervisor's watch takes it as never silent (supervisor._Watch).
    assert heartbeats.values[0] == math.inf and heartbeats.values[1] == 0.0


def test_now_serving_beats_and_tells_the_supervisor_its_index_once() -> None:
    receiving, sending = multiprocessing.Pipe(duplex=False)
    heartbeats = Board.local(2)
    worker = Worker(index=1, count=2, serving=sending, heartbeats=heartbeats)
    worker.now_serving()
    assert heartbeats.values[1] > 0.0, "serving, and not beating: the watch would kill it"
    assert receiving.poll(10) and receiving.recv() == 1
    assert sending.closed, "the pipe stays open: the supervisor would never see it end"


def test_a_worker_alone_needs_no_supervisor() -> None:
    worker = Worker()
    assert worker.alone
    worker.beat()  # no heartbeats, no pipe: nothing to tell
    worker.now_serving()
    worker.leaving()
    assert not Worker(index=0, count=2).alone


def test_an_engine_cores_death_reaches_every_engine_client() -> None:
    told: list[str] = []
    worker = Worker(index=0, count=2)
    worker.on_core_death(lambda: told.append("generate"))
    worker.on_core_death(lambda: told.append("embed"))
    worker.core_died()
    assert told == ["generate", "embed"]
