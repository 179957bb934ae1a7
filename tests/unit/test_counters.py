"""The counts the workers share (`counters`): the shared tally against the local one, across
real processes, and the table's upkeep (reused slots, rebuilds)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

from sluicegate.counters import Board, LocalTally, SharedTally, Tally


def _take_and_give(tally: SharedTally, key: str, rounds: int) -> None:
    for _ in range(rounds):
        taken, _ = tally.take(key, 1, None)
        assert taken
        tally.give_back(key, 1)
    tally.take(key, 1, None)


def test_the_shared_tally_behaves_as_the_local_one() -> None:
    for tally in (LocalTally(), SharedTally(keys=4)):
        check: Tally = tally
        assert check.take("a", 2, 3) == (True, 0)
        assert check.take("a", 2, 3) == (False, 2)  # 4 would pass 3: nothing taken
        assert check.take("a", 1, 3) == (True, 2)
        assert check.take("b", 5, None) == (True, 0)
        assert (check.count("a"), check.count("b"), check.count("c")) == (3, 5, 0)
        check.give_back("a", 3)
        check.give_back("c", 1)  # never taken: nothing to give back
        assert (check.count("a"), check.count("c")) == (0, 0)
        assert check.take("a", 3, 3) == (True, 0)


def test_processes_sharing_a_tally_lose_no_change() -> None:
    """Four processes each take and give back one count of the same key 2,000 times, then
    keep one: every change is seen, none lost to a race."""
    context = multiprocessing.get_context("spawn")
    tally = SharedTally(keys=8, context=context)
    processes = [
        context.Process(target=_take_and_give, args=(tally, "shared", 2000)) for _ in range(4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    assert tally.count("shared") == 4


def test_keys_come_and_go_without_filling_the_table() -> None:
    """Many more distinct keys than the table has slots pass through it, a few at a time:
    emptied slots are reused or dropped at a rebuild, and live counts survive rebuilds."""
    tally = SharedTally(keys=4)  # the smallest table: 1,024 slots
    assert tally.take("long-lived", 7, None) == (True, 0)
    for index in range(5000):
        key = f"key-{index}"
        assert tally.take(key, 1, 1) == (True, 0)
        if index >= 3:
            tally.give_back(f"key-{index - 3}", 1)
    assert tally.count("long-lived") == 7
    assert [tally.count(f"key-{i}") for i in range(4996, 5000)] == [0, 1, 1, 1]


def test_a_board_adds_under_its_lock_and_reads_plainly() -> None:
    board = Board.shared(3)
    board.add(1, 2.5)
    board.add(1, -1.0)
    board.values[2] = 7.0
    assert list(board.values) == [0.0, 1.5, 7.0]
    local = Board.local(2)
    local.add(0, 1.0)
    assert list(local.values) == [1.0, 0.0]


def _sees(tally: SharedTally, key: str, expected: int) -> None:
    """Another worker's view: exits 0 once `key`'s count is `expected` (1 if not in 20 s)."""
    deadline = time.monotonic() + 20
    while tally.count(key) != expected:
        if time.monotonic() > deadline:
            raise SystemExit(1)
        time.sleep(0.01)


@contextlib.contextmanager
def _held(lock: Any) -> Iterator[None]:
    """The shared lock taken, as by a worker the OS took off the CPU while it held it."""
    assert lock.acquire(timeout=5)
    try:
        yield
    finally:
        lock.release()


def test_a_give_back_while_the_lock_is_held_neither_stalls_the_loop_nor_is_lost() -> None:
    """It goes to the backlog at once, and the backlog's thread applies it once the lock is
    free, with no further change made in this process: another worker sees it."""
    context = multiprocessing.get_context("spawn")
    tally = SharedTally(keys=4, context=context)
    tally.take("key", 3, None)
    with _held(tally._lock):
        started = time.monotonic()
        tally.give_back("key", 2)
        # A hold never refused, likewise: counted once the lock is had.
        assert tally.take("other", 5, None)[0]
        stalled = time.monotonic() - started
    assert stalled < 0.5, f"the event loop waited {stalled:.2f} s for the shared lock"
    viewers = [
        context.Process(target=_sees, args=(tally, key, count))
        for key, count in (("key", 1), ("other", 5))
    ]
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join(60)
        assert viewer.exitcode == 0, "a change made while the lock was held was lost"


def test_a_check_against_a_limit_while_the_lock_is_held_is_refused_without_a_stall() -> None:
    tally = SharedTally(keys=4)
    with _held(tally._lock):
        started = time.monotonic()
        assert tally.take("key", 1, 10) == (False, 0)
        assert time.monotonic() - started < 0.5, "the event loop waited for the shared lock"
    assert tally.take("key", 1, 10) == (True, 0)


def test_a_board_change_while_its_lock_is_held_is_applied_once_it_is_free() -> None:
    board = Board.shared(2)
    assert board._lock is not None
    with _held(board._lock):
        board.add(0, 1.0)
        board.add(0, 1.0)
        assert list(board.values) == [0.0, 0.0]
    deadline = time.monotonic() + 20
    while list(board.values) != [2.0, 0.0]:
        assert time.monotonic() < deadline, "a board change made under a held lock was lost"
        time.sleep(0.01)
