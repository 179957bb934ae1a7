"""A miss's duty to generate: the lease a cache lookup hands to the request that leads.

The leader calls `fulfil` with what the run produced, which stores it (when it may be stored)
and hands it to every identical request that waited (single flight); `close` ends the lease
if the run failed or was abandoned, and the waiters generate for themselves. Nobody is ever
handed someone else's error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from sluicegate.cache.key import lock_key
from sluicegate.observability.metrics import CACHE_TTL_SECONDS
from sluicegate.wire.completion import Completion

if TYPE_CHECKING:
    from sluicegate.cache.response_cache import ResponseCache

STORABLE_FINISH_REASONS = frozenset({"stop", "length"})


class Lease:
    """A miss's duty to generate: `fulfil` with the result, or `close` to give up."""

    def __init__(
        self,
        cache: ResponseCache | None = None,
        key: str | None = None,
        expected_choices: int = 0,
        store: bool = False,
        flight: asyncio.Future[Completion | None] | None = None,
        lock_token: str | None = None,
    ) -> None:
        self._cache = cache
        self._key = key
        self._expected_choices = expected_choices
        self._store = store
        self._flight = flight
        self._lock_token = lock_token
        self._started = time.monotonic()
        self._done = False

    async def fulfil(self, completion: Completion) -> None:
        """The run ended normally: store its result if it may be, and wake the waiters."""
        if self._done or self._cache is None or self._key is None:
            return
        self._done = True
        cache = self._cache
        cache.ttl.observe(time.monotonic() - self._started)
        CACHE_TTL_SECONDS.set(cache.ttl.effective())
        reusable = self._reusable(completion)
        self._settle(completion if reusable else None)
        if reusable and self._store:
            await cache.write(self._key, completion)
        self._unlock()

    def close(self) -> None:
        """End the lease without a result (the run failed, or its client left)."""
        if self._done:
            return
        self._done = True
        self._settle(None)
        self._unlock()

    async def guard(self, events: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """`events`, then `close` however they end (a no-op after `fulfil`)."""
        try:
            async for event in events:
                yield event
        finally:
            self.close()
            await events.aclose()

    def _reusable(self, completion: Completion) -> bool:
        return len(completion.choices) == self._expected_choices and all(
            c.finish_reason in STORABLE_FINISH_REASONS for c in completion.choices
        )

    def _settle(self, completion: Completion | None) -> None:
        if self._flight is not None and self._cache is not None and self._key is not None:
            self._cache.end_flight(self._key, self._flight, completion)

    def _unlock(self) -> None:
        if self._lock_token is not None and self._cache is not None and self._key is not None:
            self._cache.release_later(lock_key(self._key), self._lock_token)
            self._lock_token = None


NO_LEASE = Lease()
