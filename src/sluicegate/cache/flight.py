"""One generation shared by identical requests: single flight over live output.

A cache miss hands its request a `Flight`. The request leads it (`lead`): the engine's deltas
are pumped by a task of the flight's own, and every request attached to it reads them from
its own queue, leader included. Identical requests arriving meanwhile `follow` it: they get
the deltas produced so far, then the live ones, each rendered in its own response format.

- The run belongs to the flight, not to a client: the leader's client leaving (or timing out)
  only detaches it. The run is aborted when the last reader is gone.
- When the run fails or is abandoned before a follower got any output, the follower generates
  for itself; it is never handed someone else's error. A streamed follower that has already
  sent part of the shared run to its client cannot start over: an engine failure of that run
  then ends its stream with the engine's error, as its own run's would.
- While the run may still be stored (and followers can still attach) the flight keeps its
  deltas, up to the entry size limit (`EntrySize`); past it, it keeps none, takes no new
  followers, builds no entry, and lets other replicas stop waiting for one.
- The flight's Redis lock (when the store is shared) is refreshed while the run lives, so
  replicas keep waiting for the entry however long the generation takes; it is released at
  the end.
- Once the run has ended, its entry is stored whoever is still reading: the readers leaving
  then (as they all do, with the response sent) abort nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluicegate.cache.entry import EntrySize
from sluicegate.cache.key import lock_key
from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import EngineUnavailableError, GatewayError
from sluicegate.inference.service import DeltaSource
from sluicegate.observability.metrics import CACHE_TTL_SECONDS
from sluicegate.wire.completion import Collector, Completion

if TYPE_CHECKING:
    from sluicegate.cache.response_cache import ResponseCache

STORABLE_FINISH_REASONS = frozenset({"stop", "length"})


class FlightLost(Exception):
    """The shared run failed or was abandoned; the follower generates for itself."""


@dataclass(frozen=True, slots=True)
class _End:
    error: BaseException | None = None


class _Reader:
    """One request's view of the flight: its deltas in order, then the end."""

    def __init__(self, flight: Flight, leads: bool) -> None:
        self._flight = flight
        self._leads = leads
        self.queue: asyncio.Queue[ChoiceDelta | _End] = asyncio.Queue()
        self._closed = False

    def __aiter__(self) -> AsyncIterator[ChoiceDelta]:
        return self

    async def __anext__(self) -> ChoiceDelta:
        if self._closed:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, ChoiceDelta):
            return item
        self.close()
        if item.error is None:
            raise StopAsyncIteration
        if self._leads:
            raise item.error  # the leader's error is its own: the status it gets
        raise FlightLost() from item.error

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._flight.leave(self)


class Flight:
    def __init__(
        self,
        cache: ResponseCache,
        key: str,
        expected_choices: int,
        prompt_tokens: Callable[[], int],
        store: bool,
        max_entry_bytes: int,
    ) -> None:
        self._cache = cache
        self.key = key
        self._expected = expected_choices
        self._prompt_tokens = prompt_tokens
        self._store = store
        self._max_entry_bytes = max_entry_bytes
        self._readers: set[_Reader] = set()
        self._kept: list[ChoiceDelta] | None = []
        self._size = EntrySize(key, expected_choices)
        self._end: _End | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock_token: str | None = None
        self._started = time.monotonic()

    @property
    def joinable(self) -> bool:
        """Whether a new follower can still get the whole output."""
        return self._kept is not None

    def hold_lock(self, token: str) -> None:
        """The flight holds the store's lock for its key: refresh it, release it at the end."""
        self._lock_token = token

    # ---- the requests attached -----------------------------------------------------------

    def lead(self, deltas: DeltaSource) -> DeltaSource:
        """Run `deltas` (the engine's) for everyone attached; the leader's own reader."""
        reader = self._attach(leads=True)
        self._task = asyncio.get_running_loop().create_task(self._pump(deltas))
        return reader

    def follow(
        self,
        generate: Callable[[], DeltaSource],
        live: bool,
        on_fallback: Callable[[], None],
    ) -> AsyncGenerator[ChoiceDelta, None]:
        """The flight's output for an identical request, or, if the flight is lost before it
        got any, its own run (`generate`; `on_fallback` is told). `live` (a stream) takes
        deltas as they come; otherwise they are held until the run ends, so a failure at any
        point can still fall back."""
        return self._follow(self._attach(leads=False), generate, live, on_fallback)

    async def _follow(
        self,
        reader: _Reader,
        generate: Callable[[], DeltaSource],
        live: bool,
        on_fallback: Callable[[], None],
    ) -> AsyncGenerator[ChoiceDelta, None]:
        sent = False
        held: list[ChoiceDelta] = []
        try:
            async for delta in reader:
                if live:
                    sent = True
                    yield delta
                else:
                    held.append(delta)
        except FlightLost:
            if sent:
                raise EngineUnavailableError("The generation this stream shared failed.") from None
            held.clear()
            on_fallback()
            async with contextlib.aclosing(generate()) as own:
                async for delta in own:
                    yield delta
            return
        finally:
            reader.close()
        for delta in held:
            yield delta

    def _attach(self, leads: bool) -> _Reader:
        reader = _Reader(self, leads)
        for delta in self._kept or ():
            reader.queue.put_nowait(delta)
        if self._end is not None:
            reader.queue.put_nowait(self._end)
        else:
            self._readers.add(reader)
        return reader

    def leave(self, reader: _Reader) -> None:
        self._readers.discard(reader)
        if self._end is not None:
            # The run is over: what the task has left (storing the entry, letting go of the
            # lock) is the flight's, not its readers'. Every reader leaves at the end, often
            # while the entry is being written, and a write cancelled then is lost whenever its
            # command had not yet reached the store (a Redis connection being opened).
            return
        if not self._readers and self._task is not None and not self._task.done():
            self._task.cancel()  # nobody reads any more: abort the run

    # ---- ending without a run --------------------------------------------------------------

    def resolve(self, completion: Completion) -> None:
        """The entry was found: followers get it as if it had been generated."""
        for delta in completion.deltas():
            self._publish(delta)
        self._finish(_End())
        self._close()

    def abandon(self) -> None:
        """The leader gave up before running: followers generate for themselves."""
        self._finish(_End(FlightLost()))

    # ---- the run ----------------------------------------------------------------------------

    async def _pump(self, deltas: DeltaSource) -> None:
        refresher = self._refresh_lock() if self._lock_token is not None else None
        try:
            async with contextlib.aclosing(deltas):
                async for delta in deltas:
                    self._publish(delta)
        except asyncio.CancelledError:
            self._finish(_End(EngineUnavailableError("The generation was abandoned.")))
            raise
        except Exception as exc:
            self._finish(_End(exc))
        else:
            completion = self._completion()
            self._finish(_End())
            self._cache.ttl.observe(time.monotonic() - self._started)
            CACHE_TTL_SECONDS.set(self._cache.ttl.effective())
            if completion is not None and self._store:
                await self._cache.write(self.key, completion)
        finally:
            if refresher is not None:
                refresher.cancel()
            self._close()

    def _publish(self, delta: ChoiceDelta) -> None:
        if self._kept is not None:
            if self._size.add(delta) > self._max_entry_bytes:
                # Too large to store: keep nothing more, and let nobody wait for an entry.
                self._kept = None
                self._close()
            else:
                self._kept.append(delta)
        for reader in self._readers:
            reader.queue.put_nowait(delta)

    def _finish(self, end: _End) -> None:
        if self._end is not None:
            return
        self._end = end
        for reader in self._readers:
            reader.queue.put_nowait(end)
        self._readers.clear()
        if end.error is not None:
            self._kept = None
            self._close()

    def _completion(self) -> Completion | None:
        """The run's result if it may be stored: kept whole, every choice ended normally."""
        if self._kept is None:
            return None
        collector = Collector()
        try:
            for delta in self._kept:
                collector.add(delta)
        except GatewayError:  # an aborted choice
            return None
        # Read at the end: an engine may count the prompt as it runs (an upstream's usage).
        completion = collector.completion(self._prompt_tokens())
        if len(completion.choices) != self._expected or any(
            c.finish_reason not in STORABLE_FINISH_REASONS for c in completion.choices
        ):
            return None
        return completion

    def _close(self) -> None:
        """No new followers, and the lock let go (idempotent)."""
        self._cache.end_flight(self)
        if self._lock_token is not None:
            self._cache.release_later(lock_key(self.key), self._lock_token)
            self._lock_token = None

    def _refresh_lock(self) -> asyncio.Task[None]:
        async def refresh() -> None:
            every = self._cache.lock_ttl / 3
            while self._lock_token is not None:
                await asyncio.sleep(every)
                token = self._lock_token
                if token is None or not await self._cache.refresh_lock(lock_key(self.key), token):
                    return

        return asyncio.get_running_loop().create_task(refresh())
