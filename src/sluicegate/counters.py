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
never across an await. A worker that cannot have the lock within `LOCK_WAIT` seconds (one that
died holding it) is refused rather than left waiting: `take` refuses, a give-back is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
from collections.abc import Iterator, MutableSequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LOCK_WAIT = 2.0
"""Seconds a worker waits for the shared lock before giving up on the change."""


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

    def take(self, key: str, amount: int, limit: int | None) -> tuple[bool, int]:
        digest = _hash(key)
        with self._locked() as locked:
            if not locked:
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
        with self._locked() as locked:
            if not locked:
                return
            slot = self._find(digest, insert=False)
            if slot >= 0:
                self._table[slot + 1] = max(0, self._table[slot + 1] - amount)

    def count(self, key: str) -> int:
        digest = _hash(key)
        with self._locked() as locked:
            slot = self._find(digest, insert=False) if locked else -1
            return 0 if slot < 0 else self._table[slot + 1]

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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        if not self._lock.acquire(timeout=LOCK_WAIT):
            logger.error(
                "a shared count's lock was not had in %g s: the change is dropped", LOCK_WAIT
            )
            yield False
            return
        try:
            yield True
        finally:
            self._lock.release()


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

    @classmethod
    def local(cls, size: int) -> Board:
        return cls([0.0] * size)

    @classmethod
    def shared(cls, size: int, context: Any = None) -> Board:
        context = context or multiprocessing.get_context("spawn")
        return cls(context.RawArray("d", size), context.Lock())

    def add(self, index: int, amount: float) -> None:
        if self._lock is None:
            self.values[index] += amount
            return
        if not self._lock.acquire(timeout=LOCK_WAIT):
            logger.error(
                "a shared count's lock was not had in %g s: the change is dropped", LOCK_WAIT
            )
            return
        try:
            self.values[index] += amount
        finally:
            self._lock.release()
