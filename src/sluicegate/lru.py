"""The one bounded LRU of the gateway: memos and the in-process cache store build on it.

Entries are dropped least recently used first once there are more than `max_entries`, or once
their sizes (as the caller counts them) add up to more than `max_size`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    def __init__(self, max_entries: int | None = None, max_size: int | None = None) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_size = max_size
        self._size = 0

    @property
    def size(self) -> int:
        """The sum of the sizes of the entries held."""
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value under `key`, now the most recently used; None if absent."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, size: int = 0) -> None:
        """Keep `value` under `key` as the most recent entry; a value larger than the whole
        bound is not kept (and an older value under `key` goes)."""
        self.pop(key)
        if self._max_size is not None and size > self._max_size:
            return
        self._entries[key] = (value, size)
        self._size += size
        while (self._max_size is not None and self._size > self._max_size) or (
            self._max_entries is not None and len(self._entries) > self._max_entries
        ):
            _, (_, dropped) = self._entries.popitem(last=False)
            self._size -= dropped

    def pop(self, key: K) -> V | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self._size -= found[1]
        return found[0]

    def clear(self) -> None:
        self._entries.clear()
        self._size = 0
