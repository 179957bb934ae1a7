"""The response cache: lookup, single flight, and storing what the engine produced.

`ResponseCache.lookup` decides, for one prepared run, whether the response comes from the
cache (HIT) or from the engine (MISS, or BYPASS when the request or the policy keeps the
cache out). A miss comes with a `Flight` (`cache.flight`) for the request to lead: its run's
output goes to every identical request that arrives while it lives (single flight; those are
HITs), and is stored when it ends normally.

Single flight works in two layers. In the process, identical requests attach to the leader's
flight and read its live output. Across processes (replicas sharing Redis), the leader takes
a lock, refreshed while its run lives; other processes poll for the entry while the lock
stands (bounded by their own request's time), then generate themselves if none came.

Entries read from the store are kept decoded in a near cache (`cache.near`), so that the
next hits on them cost no round trip, no decoding, and (on the hit path) no rendering.

The store failing never fails a request: the error is counted and logged (throttled), the
store is left alone for `retry_interval`, and requests are served by the engine meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from sluicegate.cache.entry import CorruptEntryError, decode_entry, encode_entry
from sluicegate.cache.fast_path import FastPath, HitShape
from sluicegate.cache.flight import Flight
from sluicegate.cache.key import CachePolicy, cache_key, is_cacheable, lock_key
from sluicegate.cache.near import NearCache, NearEntry
from sluicegate.cache.store import CacheStore, StoreError
from sluicegate.cache.ttl import TtlPolicy
from sluicegate.inference.run import Run
from sluicegate.observability.metrics import (
    CACHE_BYTES_WRITTEN,
    CACHE_LOOKUP_SECONDS,
    CACHE_REQUESTS,
    CACHE_STAMPEDE_FOLLOWERS,
    CACHE_STORE_ERRORS,
    CACHE_TTL_SECONDS,
)
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.observability.tracing import span
from sluicegate.wire.body_template import BodyTemplate, encoded
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import render_cached

logger = logging.getLogger(__name__)

CacheOutcome = Literal["HIT", "MISS", "BYPASS"]
T = TypeVar("T")
Waiter = Callable[[Coroutine[Any, Any, T]], Awaitable[T]]


async def _wait_forever(work: Coroutine[Any, Any, T]) -> T:
    return await work


_HITS = CACHE_REQUESTS.labels(outcome="hit")
_POLL_FIRST = 0.01
_POLL_MAX = 0.1


class Coherence(Protocol):
    """What keeps the near cache true to a store that other processes write (running)."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CacheControl:
    """The request's `Cache-Control` directives that the cache honours."""

    no_cache: bool = False
    """Skip the lookup; the fresh response replaces the entry."""
    no_store: bool = False
    """Do not store the response."""

    @classmethod
    def parse(cls, header: str | None) -> CacheControl:
        if not header:
            return cls()
        directives = {part.split("=", 1)[0].strip().lower() for part in header.split(",")}
        return cls("no-cache" in directives, "no-store" in directives)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    policy: CachePolicy = "deterministic"
    prefix: str = "sluicegate"
    per_key: bool = False
    """Entries (and fast-path notes) kept apart per API key id."""
    max_entry_bytes: int = 1024 * 1024
    flight_timeout: float = 30.0
    """How long the single-flight lock outlives its last refresh (a leader that died)."""
    retry_interval: float = 1.0


@dataclass(frozen=True, slots=True)
class Lookup:
    outcome: CacheOutcome
    flight: Flight | None = None
    """The generation to lead (`leads`) or to follow; None: generate on one's own."""
    leads: bool = False
    completion: Completion | None = None
    """The cached response, on a hit."""
    entry: NearEntry | None = None
    """The entry it came from, on a hit read from the store (or the near cache)."""
    age: int = 0
    """Seconds since the cached response was generated, on a hit."""

    def headers(self) -> dict[str, str]:
        if self.outcome == "HIT":
            return {"x-cache": "HIT", "age": str(self.age)}
        return {"x-cache": self.outcome}


class ResponseCache:
    def __init__(
        self,
        store: CacheStore,
        ttl: TtlPolicy,
        config: CacheConfig,
        near: NearCache | None = None,
        coherence: Coherence | None = None,
    ) -> None:
        """`near`: off when None. `coherence` keeps it true to a store other processes
        write (`cache.invalidation`); without one the store is this process's alone."""
        self.store = store
        self.ttl = ttl
        self._config = config
        self._flights: dict[str, Flight] = {}
        self._down_until = 0.0
        self._warning = ThrottledWarning(logger)
        self._background: set[asyncio.Task[None]] = set()
        self.fast_path = FastPath(enabled=config.policy != "off", per_key=config.per_key)
        self.near = near if near is not None else NearCache(0, 0)
        self._writing: dict[str, NearEntry] = {}
        self._coherence = coherence
        if coherence is None:
            self.near.connect()
        CACHE_TTL_SECONDS.set(ttl.effective())

    def answer(self, entry: NearEntry, shape: HitShape) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """A hit's body and headers (encoded) for the fast path: the body rendered from
        `entry` before for requests of this shape, with a new id and time, or rendered now
        (and kept)."""
        if shape.body_key is None:
            fmt = shape.format.renewed()
            answer = render_cached(fmt, entry.completion, shape.stream, shape.include_usage)
            return answer.body, encoded(answer.headers)
        body = entry.bodies.get(shape.body_key)
        if body is not None:
            return body.fill()
        answer, body = BodyTemplate.of(
            shape.format, entry.completion, shape.stream, shape.include_usage
        )
        if body is not None:
            self.near.add_body(shape.key, entry, shape.body_key, body)
        return answer.body, encoded(answer.headers)

    @property
    def lock_ttl(self) -> float:
        """Seconds a single-flight lock lives past its last refresh."""
        return self._config.flight_timeout

    async def fetch(self, key: str) -> Lookup | None:
        """The hit stored under `key`, for the fast path. A hit is counted here; a miss or a
        corrupt entry is left for the full path, which the request takes next."""
        with span("cache.lookup", {"sluicegate.cache.fast_path": True}) as current:
            found = await self._read(key, recheck=True)
            current.set_attribute("sluicegate.cache.outcome", "HIT" if found else "MISS")
        if found is None:
            return None
        _HITS.inc()
        return _hit(found)

    def key_for(self, run: Run, endpoint: str, key_id: str) -> str:
        config = self._config
        return cache_key(
            config.prefix,
            run.model,
            run.identity,
            endpoint,
            run.prompts,
            run.options,
            namespace=key_id if config.per_key else None,
            shape=None if run.echo is None else run.echo.key(),
        )

    async def lookup(
        self,
        run: Run,
        endpoint: str,
        key_id: str,
        control: CacheControl,
        wait: Waiter[Any] = _wait_forever,
        fingerprint: str | None = None,
        stream: bool = False,
    ) -> Lookup:
        """Find the run's response, or the flight to generate it. Never raises a store error.

        `wait` runs the wait for another replica's entry, so the caller can end it early, for
        instance when its client leaves. `fingerprint` is the request body's (see
        `cache.fast_path`): a cacheable run is noted under it, so the same body is answered
        before routing next time."""
        with span("cache.lookup", {"sluicegate.cache.policy": self._config.policy}) as current:
            lookup = await self._lookup(run, endpoint, key_id, control, wait, fingerprint, stream)
            current.set_attribute("sluicegate.cache.outcome", lookup.outcome)
        CACHE_REQUESTS.labels(outcome=lookup.outcome.lower()).inc()
        return lookup

    async def _lookup(
        self,
        run: Run,
        endpoint: str,
        key_id: str,
        control: CacheControl,
        wait: Waiter[Any],
        fingerprint: str | None,
        stream: bool,
    ) -> Lookup:
        if not is_cacheable(run.options, self._config.policy) or (
            control.no_cache and control.no_store
        ):
            return Lookup("BYPASS")
        key = self.key_for(run, endpoint, key_id)
        if control.no_cache:
            # Generates and replaces the entry; nobody attaches to it.
            return Lookup("BYPASS", self._new_flight(key, run, store=True), leads=True)
        if fingerprint is not None and not _images_vary(run):
            self.fast_path.note(fingerprint, HitShape.of(key, run, stream))

        leader = self._flights.get(key)
        if leader is not None:
            CACHE_STAMPEDE_FOLLOWERS.inc()
            return Lookup("HIT", leader)

        # Registered before the first await, so identical requests from now on follow us.
        flight = self._flights[key] = self._new_flight(key, run, store=not control.no_store)
        try:
            return await self._lead(key, flight, wait)
        except BaseException:
            flight.abandon()
            raise

    def _new_flight(self, key: str, run: Run, store: bool) -> Flight:
        config = self._config
        return Flight(
            self,
            key,
            run.expected_choices,
            lambda: run.prompt_tokens,
            store,
            config.max_entry_bytes,
        )

    async def _lead(self, key: str, flight: Flight, wait: Waiter[Any]) -> Lookup:
        found = await self._read(key)
        if found is not None:
            flight.resolve(found.completion)
            return _hit(found)
        if self.store.shared:
            token = secrets.token_hex(8)
            taken = await self._acquire(lock_key(key), token)
            if taken is False:
                CACHE_STAMPEDE_FOLLOWERS.inc()
                found = await wait(self._await_entry(key))
                if found is not None:
                    flight.resolve(found.completion)
                    return _hit(found)
            elif taken:
                # The leader before us may have stored its entry and let go just now.
                found = await self._read(key, recheck=True)
                if found is not None:
                    self.release_later(lock_key(key), token)
                    flight.resolve(found.completion)
                    return _hit(found)
                flight.hold_lock(token)
        return Lookup("MISS", flight, leads=True)

    async def _await_entry(self, key: str) -> NearEntry | None:
        """Poll for the entry another process is generating, while its lock stands (the
        leader refreshes it while its run lives; the caller's `wait` bounds the whole)."""
        interval = _POLL_FIRST
        lock = lock_key(key)
        while True:
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, _POLL_MAX)
            found = await self._read(key)
            if found is not None:
                return found
            try:
                if not self._available() or not await self.store.held(lock):
                    return await self._read(key)
            except StoreError as exc:
                self._failed("lock", exc)
                return None

    def end_flight(self, flight: Flight) -> None:
        """Identical requests no longer attach to `flight`."""
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]

    # ---- store operations: each failure is counted, logged, and survived ----------------

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, exc: BaseException) -> None:
        CACHE_STORE_ERRORS.labels(op=op).inc()
        if not isinstance(exc, CorruptEntryError):
            self._down_until = time.monotonic() + self._config.retry_interval
        self._warning.warn("cache store %s failed (%s); serving from the engine", op, exc)

    async def _read(self, key: str, recheck: bool = False) -> NearEntry | None:
        """The entry under `key`, or None. A corrupt entry is counted once, not on `recheck`."""
        found = self._writing.get(key) or self.near.get(key)
        if found is not None:
            return found
        if not self._available():
            return None
        token = self.near.begin_fill(key)
        began, started = time.monotonic(), time.perf_counter()
        try:
            stored = await self.store.read(key)
            if stored is None:
                return None
            data, ttl_ms = stored
            completion, created = decode_entry(key, data)
            # Its TTL counted from before the read: it expires before the store's entry.
            found = self.near.fill(key, token, completion, created, began + ttl_ms / 1000)
            return found
        except StoreError as exc:
            self._failed("get", exc)
            return None
        except CorruptEntryError as exc:
            if not recheck:
                self._failed("decode", exc)
            return None
        finally:
            if found is None:
                self.near.end_fill(key, token)
            CACHE_LOOKUP_SECONDS.observe(time.perf_counter() - started)

    async def _acquire(self, lock: str, token: str) -> bool | None:
        """True: taken; False: someone else holds it; None: the store did not answer."""
        if not self._available():
            return None
        try:
            return await self.store.acquire(lock, token, round(self._config.flight_timeout * 1000))
        except StoreError as exc:
            self._failed("lock", exc)
            return None

    async def refresh_lock(self, lock: str, token: str) -> bool:
        """Extend a lock we hold; False once it is no longer ours."""
        if not self._available():
            return True  # try again next time; the lock may lapse meanwhile
        try:
            return await self.store.refresh(lock, token, round(self._config.flight_timeout * 1000))
        except StoreError as exc:
            self._failed("lock", exc)
            return True

    async def write(self, key: str, completion: Completion) -> None:
        created = time.time()
        data = encode_entry(key, completion, created)
        # What this process kept is stale from now on, whatever becomes of the write (other
        # processes hear of it from Redis).
        self.near.invalidate((key,))
        if len(data) > self._config.max_entry_bytes or not self._available():
            return
        ttl_ms = self.ttl.sample_ms()
        # The flight's requests are answered before the write ends: this process's next
        # reads of the key get the entry being written, not the one it replaces.
        writing = self._writing[key] = NearEntry(completion, created, math.inf, 0)
        with span(
            "cache.store", {"sluicegate.cache.bytes": len(data), "sluicegate.cache.ttl_ms": ttl_ms}
        ):
            try:
                await self.store.set(key, data, ttl_ms)
            except StoreError as exc:
                self._failed("set", exc)
                return
            finally:
                if self._writing.get(key) is writing:
                    del self._writing[key]
        CACHE_BYTES_WRITTEN.inc(len(data))

    def release_later(self, lock: str, token: str) -> None:
        """Let go of a lock without making the request wait (or fail) for it."""

        async def release() -> None:
            try:
                await self.store.release(lock, token)
            except StoreError as exc:
                self._failed("unlock", exc)

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._coherence is not None:
            await self._coherence.close()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _hit(found: NearEntry) -> Lookup:
    age = max(0, int(time.time() - found.created))
    return Lookup("HIT", completion=found.completion, entry=found, age=age)


def _images_vary(run: Run) -> bool:
    """Whether the same body may be another request later, or be counted otherwise: an image
    by URL may give other bytes (its key, the bytes' digest, still finds the entry once
    fetched), and an upstream's estimate of its images is not the count a hit charges."""
    return any(p.images_estimated or any(i.url for i in p.images) for p in run.prompts)
