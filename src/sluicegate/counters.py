"""Counts that hold for the whole gateway, whether it runs in one process or in several.

With `SLUICEGATE_WORKERS` > 1 each worker is a process of its own, and a count kept in one
worker's memory would let the gateway take N times what an operator allows. These live in
shared memory instead, made by the supervisor before it starts the workers and inherited by
each of them; with one process they are plain Python objects, with the same interface.

- `Tally`: counts by key (requests in flight overall and per API key, a key's sequences),
  with an atomic check-and-take against a limit.
- `Board`: a short row of floats (the engine's load after its latest step) that one worker
  writes and every worker reads.

A shared count is changed under one lock for all the workers, held for a few microseconds and
never across an await. The event loop never waits long for it: at most `LOCK_WAIT` (the holder
may be off the CPU for a moment). A change that finds it taken for longer is not dropped: a
give-back (or a count taken with no limit) waits in this process's `Backlog`, which the next
change made here under the lock applies first, and a thread of its own applies as soon as it
has the lock, off the loop. Only a `take` against a limit, which must know the count now, is
refused instead; a `count` then reads the table without the lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator, MutableSequence
from typing import Any, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K")
N = TypeVar("N", int, float)

LOCK_WAIT = 0.02
"""Seconds the event loop may wait for the shared lock (held for microseconds, unless its
holder was taken off the CPU: this covers one scheduling period of a busy host) before a
change goes to the `Backlog`, or a check is refused."""
BACKLOG_WARNING = 2.0
"""Seconds the backlog's thread waits for the lock before it logs that it still waits."""


class Tally(Protocol):
    def take(self, key: str, amount: int, limit: int | None) -> tuple[bool, int]:
        """Add `amount` to `key`'s count unless that would pass `limit` (None: no limit).
        Returns whether it was taken, and the count before."""
        ...

    def give_back(self, key: str, amount: int) -> None: ...

    def count(self, key: str) -> int: ...


class LocalTally:
    """A `Tally` in this process's memory: counts drop out when they reach 0."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def take(self, key: str, amount: int, limit: int | None) -> tuple[bool, int]:
        held = self._counts.get(key, 0)
        if limit is not None and held + amount > limit:
            return False, held
        if amount:
            self._counts[key] = held + amount
        return True, held

    def give_back(self, key: str, amount: int) -> None:
        left = self._counts.get(key, 0) - amount
        if left > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)


class SharedTally:
    """A `Tally` in shared memory: an open-addressing table of (key hash, count) slots.

    Keys are hashed to 64 bits (blake2b); a slot whose count fell to 0 keeps its hash, so that
    the probe paths through it stay whole, and is reused by the next new key that passes it.
    When used slots reach half the table it is rebuilt from the live ones. The table holds at
    least four times `keys` slots: the distinct keys that can hold a count at once."""

    def __init__(self, keys: int, context: Any = None) -> None:
        context = context or multiprocessing.get_context("spawn")
        size = 1024
        while size < 4 * keys:
            size *= 2
        self._size = size
        # [used slots] + size × [hash, count]
        self._table: MutableSequence[int] = context.RawArray("q", 1 + 2 * size)
        self._lock = context.Lock()
        self._backlog: Backlog[int, int] = Backlog(self._lock, self._apply)

    def __getstate__(self) -> dict[str, Any]:
        # The backlog is this process's own (its thread and its changes).
        return {name: value for name, value in vars(self).items() if name != "_backlog"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._backlog = Backlog(self._lock, self._apply)

    def take(self, key: str, amount: int, limit: int | None) -> tuple[bool, int]:
        digest = _hash(key)
        with self._backlog.locked() as locked:
            if not locked:
                if limit is None:  # no check to make: counted as soon as the lock is had
                    self._backlog.add(digest, amount)
                    return True, 0
                return False, 0
            slot = self._find(digest, insert=True)
            table = self._table
            held = table[slot + 1]
            if limit is not None and held + amount > limit:
                return False, held
            table[slot + 1] = held + amount
            return True, held

    def give_back(self, key: str, amount: int) -> None:
        digest = _hash(key)
        with self._backlog.locked() as locked:
            if locked:
                self._apply({digest: -amount})
            else:
                self._backlog.add(digest, -amount)

    def count(self, key: str) -> int:
        digest = _hash(key)
        with self._backlog.locked():
            # Without the lock too: a read that may miss a change being made.
            slot = self._find(digest, insert=False)
            return 0 if slot < 0 else self._table[slot + 1]

    def _apply(self, changes: dict[int, int]) -> None:
        """Add each change to its key's count (the lock held); a count never goes below 0."""
        for digest, amount in changes.items():
            slot = self._find(digest, insert=amount > 0)
            if slot >= 0:
                self._table[slot + 1] = max(0, self._table[slot + 1] + amount)

    def _find(self, digest: int, insert: bool) -> int:
        """The index of `digest`'s slot (its hash word); with `insert`, made when missing
        (the lock held); without, -1 when missing."""
        table, size = self._table, self._size
        free = -1
        position = digest % size
        for _ in range(size):
            index = 1 + 2 * position
            found = table[index]
            if found == digest:
                return index
            if found == 0:
                break
            if free < 0 and table[index + 1] == 0:
                free = index
            position = (position + 1) % size
        else:
            index = -1  # every slot used: only `free` can be had
        if not insert:
            return -1
        if free < 0:
            if index < 0 or table[0] + 1 > size // 2:
                self._rebuild()
                return self._find(digest, insert)
            table[0] += 1
            free = index
        table[free], table[free + 1] = digest, 0
        return free

    def _rebuild(self) -> None:
        table, size = self._table, self._size
        live = [(table[1 + 2 * p], table[2 + 2 * p]) for p in range(size) if table[2 + 2 * p] > 0]
        if len(live) >= size // 2:
            raise RuntimeError(f"a shared tally of {size} slots holds {len(live)} live keys")
        for index in range(len(table)):
            table[index] = 0
        for digest, held in live:
            position = digest % size
            while table[1 + 2 * position] != 0:
                position = (position + 1) % size
            table[1 + 2 * position], table[2 + 2 * position] = digest, held
        table[0] = len(live)


def _hash(key: str) -> int:
    """A non-zero signed 64-bit hash of `key` (0 marks an empty slot)."""
    digest = int.from_bytes(
        hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True
    )
    return digest or 1


class Board:
    """A row of floats one process writes and others read, with a lock for read-modify-write
    changes (`adding`). Plain reads and writes of one value need none."""

    def __init__(self, values: MutableSequence[float], lock: Any = None) -> None:
        self.values = values
        self._lock = lock
        self._backlog: Backlog[int, float] | None = None
        if lock is not None:
            self._backlog = Backlog(lock, self._apply)

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values, "lock": self._lock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values, self._lock = state["values"], state["lock"]
        self._backlog = None if self._lock is None else Backlog(self._lock, self._apply)

    @classmethod
    def local(cls, size: int) -> Board:
        return cls([0.0] * size)

    @classmethod
    def shared(cls, size: int, context: Any = None) -> Board:
        context = context or multiprocessing.get_context("spawn")
        return cls(context.RawArray("d", size), context.Lock())

    def add(self, index: int, amount: float) -> None:
        if self._backlog is None:
            self.values[index] += amount
            return
        with self._backlog.locked() as locked:
            if locked:
                self.values[index] += amount
            else:
                self._backlog.add(index, amount)

    def _apply(self, changes: dict[int, float]) -> None:
        for index, amount in changes.items():
            self.values[index] += amount


class Backlog(Generic[K, N]):
    """Changes to shared counts that found their lock taken: applied first by the next change
    made in this process under the lock (`locked`), or by a thread of this process that
    waits for the lock off the event loop; never dropped. One per shared object and process
    (it is not passed to the workers)."""

    def __init__(self, lock: Any, apply: Callable[[dict[K, N]], None]) -> None:
        self._lock = lock
        self._apply: Callable[[dict[K, N]], None] = apply
        self._guard = threading.Lock()
        self._changes: dict[K, N] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """The shared lock, waited for `LOCK_WAIT` at most: whether it was had. Had, what
        waits in the backlog is applied first, so changes keep their order."""
        if not self._lock.acquire(timeout=LOCK_WAIT):
            yield False
            return
        try:
            self._drain()
            yield True
        finally:
            self._lock.release()

    def add(self, key: K, amount: N) -> None:
        with self._guard:
            self._changes[key] = self._changes.get(key, 0) + amount
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._apply_when_free, name="shared-count-backlog", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def __len__(self) -> int:
        return len(self._changes)

    def _drain(self) -> None:
        """Apply what waits (the shared lock held)."""
        if not self._changes:
            return
        with self._guard:
            changes, self._changes = self._changes, {}
        self._apply(changes)

    def _apply_when_free(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while not self._lock.acquire(timeout=BACKLOG_WARNING):
                logger.error(
                    "a shared count's lock has been taken for %g s: %d change(s) wait for it",
                    BACKLOG_WARNING,
                    len(self._changes),
                )
            try:
                self._drain()
            finally:
                self._lock.release()
