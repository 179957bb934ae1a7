"""The near cache: entries of the cache store kept decoded in this process, for hot keys.

A hit served from here costs one dictionary lookup: no store round trip, no decoding, and
for the hit path one join of a body rendered before (`wire.body_template`). The entries are
bounded by their size in bytes (an upper estimate of the memory they hold), least recently
used going first, and never outlive their entry in the store.

Coherence. With Redis, other processes write too, so the near cache serves only what it can
be told is no longer true: `cache.invalidation` keeps a connection on which Redis reports
every change to a cache key, and drives the two gates here:

- `connected`: the reports flow. Entries are kept (`fill`) only while they do; losing the
  connection flushes everything.
- `fresh_until`: entries are served only until then. Each answered heartbeat proves that
  every change Redis made before it was sent has been reported (and applied: the reports
  come first on that connection); it moves this to the heartbeat's sending time plus
  `max_lag`. So however the connection fails, silently or not, no change is served stale
  for longer than `max_lag`.

A read from the store races with the reports of changes made after it: `begin_fill` notes
the key before the read, a report for the key (or a flush) drops the note, and `fill` keeps
the entry only if its note is still there.

The in-process store has no other writer: its near cache is always connected and fresh,
and the cache drops an entry here itself when it writes one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from sluicegate.lru import BoundedLRU
from sluicegate.observability.metrics import (
    CACHE_NEAR_BYTES,
    CACHE_NEAR_FLUSHES,
    CACHE_NEAR_INVALIDATIONS,
    CACHE_NEAR_REQUESTS,
)
from sluicegate.wire.body_template import BodyTemplate
from sluicegate.wire.completion import Completion

# Upper bounds of what the objects of a decoded entry cost beyond their strings (CPython
# 3.11, 64-bit): the entry, the completion and their containers; a choice (its object and
# lists); one list slot; a logprob (object, float, tuple); one alternative (tuple, float).
_ENTRY = 640
_CHOICE = 400
_SLOT = 8
_LOGPROB = 160
_ALTERNATIVE = 96

_HIT = CACHE_NEAR_REQUESTS.labels(outcome="hit")
_MISS = CACHE_NEAR_REQUESTS.labels(outcome="miss")
_OFF = CACHE_NEAR_REQUESTS.labels(outcome="off")


@dataclass(eq=False, slots=True)
class NearEntry:
    """A decoded entry, and the bodies rendered from it so far."""

    completion: Completion
    created: float
    """When it was generated (Unix seconds)."""
    expires: float
    """Monotonic time its entry in the store expires, or sooner."""
    size: int
    bodies: dict[Hashable, BodyTemplate] = field(default_factory=dict)


class NearCache:
    def __init__(
        self,
        max_bytes: int,
        max_entry_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self._max_entry = min(max_entry_bytes, max_bytes)
        self._clock = clock
        self._entries: BoundedLRU[str, NearEntry] = BoundedLRU(max_size=max_bytes)
        self._pending: dict[str, object] = {}
        self.connected = False
        self.fresh_until = -math.inf

    @property
    def size_bytes(self) -> int:
        return self._entries.size

    def __len__(self) -> int:
        return len(self._entries)

    # ---- the gates (see the module docstring) ---------------------------------------------

    def connect(self, fresh_until: float = math.inf) -> None:
        """Reports of changes flow from now on (the near cache was empty until now)."""
        if not self.max_bytes:
            return  # off
        self.connected = True
        self.fresh_until = fresh_until

    def disconnect(self) -> None:
        """Reports no longer flow: keep nothing, serve nothing."""
        self.connected = False
        self.fresh_until = -math.inf
        self.flush()

    def flush(self) -> None:
        if self._entries:
            CACHE_NEAR_FLUSHES.inc()
        self._entries.clear()
        self._pending.clear()
        CACHE_NEAR_BYTES.set(0)

    def invalidate(self, keys: Iterable[str]) -> None:
        """The entries under `keys` changed in the store (or are about to)."""
        dropped = 0
        for key in keys:
            self._pending.pop(key, None)
            if self._entries.pop(key) is not None:
                dropped += 1
        if dropped:
            CACHE_NEAR_INVALIDATIONS.inc(dropped)
            CACHE_NEAR_BYTES.set(self._entries.size)

    # ---- entries --------------------------------------------------------------------------

    def get(self, key: str) -> NearEntry | None:
        """The entry under `key`, if it may be served."""
        now = self._clock()
        if now >= self.fresh_until:
            if self.max_bytes:
                _OFF.inc()
            return None
        entry = self._entries.get(key)
        if entry is None:
            _MISS.inc()
            return None
        if entry.expires <= now:
            self._entries.pop(key)
            CACHE_NEAR_BYTES.set(self._entries.size)
            _MISS.inc()
            return None
        _HIT.inc()
        return entry

    def begin_fill(self, key: str) -> object | None:
        """Note a read of `key` from the store; the token to keep its result with."""
        if not self.connected:
            return None
        token = self._pending[key] = object()
        return token

    def fill(
        self,
        key: str,
        token: object | None,
        completion: Completion,
        created: float,
        expires: float,
    ) -> NearEntry:
        """The entry read under `key`, kept if nothing changed it since `begin_fill`."""
        entry = NearEntry(completion, created, expires, 0)
        if token is None or self._pending.get(key) is not token:
            return entry
        del self._pending[key]
        entry.size = _ENTRY + 2 * len(key) + completion_size(completion)
        if entry.size <= self._max_entry and expires > self._clock():
            self._entries.put(key, entry, entry.size)
            CACHE_NEAR_BYTES.set(self._entries.size)
        return entry

    def end_fill(self, key: str, token: object | None) -> None:
        """The read of `key` came to nothing."""
        if token is not None and self._pending.get(key) is token:
            del self._pending[key]

    def add_body(self, key: str, entry: NearEntry, body_key: Hashable, body: BodyTemplate) -> None:
        """Keep a body rendered from `entry`, if the entry is still kept."""
        if body_key in entry.bodies or self._entries.get(key) is not entry:
            return
        entry.bodies[body_key] = body
        entry.size += body.size
        self._entries.put(key, entry, entry.size)
        CACHE_NEAR_BYTES.set(self._entries.size)


def completion_size(completion: Completion) -> int:
    """Bytes a decoded completion holds, an upper estimate."""
    size = 0
    for choice in completion.choices:
        size += _CHOICE + sum(sys.getsizeof(part) + _SLOT for part in choice.text_parts)
        size += sum(sys.getsizeof(part) + _SLOT for part in choice.reasoning_parts or ())
        size += sys.getsizeof(choice.finish_reason or "")
        if choice.logprobs is not None:
            size += _SLOT * len(choice.logprob_counts or ())
            for entry in choice.logprobs:
                size += _LOGPROB + _SLOT + sys.getsizeof(entry.token)
                size += sum(_ALTERNATIVE + sys.getsizeof(token) for token, _ in entry.top)
    return size
