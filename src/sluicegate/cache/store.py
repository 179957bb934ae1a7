"""Where cache entries live: Redis (shared by replicas) or a bounded in-process LRU.

Both stores hold opaque bytes with a TTL, plus the short-lived locks single flight uses.
`RedisStore` bounds every operation by a timeout and turns every failure into `StoreError`;
what to do about one (serve from the engine, count, log) is the cache's decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.lru import BoundedLRU


class StoreError(Exception):
    """The store did not answer in time, or failed."""


class CacheStore(Protocol):
    shared: bool
    """Whether other processes see the same entries (and locks)."""

    async def get(self, key: str) -> bytes | None: ...

    async def read(self, key: str) -> tuple[bytes, int] | None:
        """The value under `key` and the milliseconds it has left (0 if unknown)."""
        ...

    async def set(self, key: str, value: bytes, ttl_ms: int) -> None: ...

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The values under `keys`, in order (None where there is none), in one round trip."""
        ...

    async def set_many(self, items: list[tuple[str, bytes]], ttl_ms: int) -> None:
        """Store every `(key, value)`, each for `ttl_ms`, in one round trip."""
        ...

    async def acquire(self, lock: str, token: str, ttl_ms: int) -> bool:
        """Take `lock` for `ttl_ms` unless someone holds it."""
        ...

    async def refresh(self, lock: str, token: str, ttl_ms: int) -> bool:
        """Give `lock` `ttl_ms` more if `token` still holds it; whether it does."""
        ...

    async def release(self, lock: str, token: str) -> None:
        """Drop `lock` if `token` still holds it."""
        ...

    async def held(self, lock: str) -> bool: ...


class MemoryStore:
    """Entries bounded by their total size in bytes, least recently used going first;
    expired entries are dropped when met.

    Locks are not needed here: in one process, the cache's own single flight suffices."""

    shared = False

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: BoundedLRU[str, tuple[float, bytes]] = BoundedLRU(max_size=max_bytes)

    @property
    def size_bytes(self) -> int:
        return self._entries.size

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        found = await self.read(key)
        return None if found is None else found[0]

    async def read(self, key: str) -> tuple[bytes, int] | None:
        item = self._entries.get(key)
        if item is None:
            return None
        expires, value = item
        left = expires - self._clock()
        if left <= 0:
            self._entries.pop(key)
            return None
        return value, int(left * 1000)

    async def set(self, key: str, value: bytes, ttl_ms: int) -> None:
        expires = self._clock() + ttl_ms / 1000
        self._entries.put(key, (expires, value), size=len(key) + len(value))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def set_many(self, items: list[tuple[str, bytes]], ttl_ms: int) -> None:
        for key, value in items:
            await self.set(key, value, ttl_ms)

    async def acquire(self, lock: str, token: str, ttl_ms: int) -> bool:
        return True

    async def refresh(self, lock: str, token: str, ttl_ms: int) -> bool:
        return True

    async def release(self, lock: str, token: str) -> None:
        return None

    async def held(self, lock: str) -> bool:
        return False


# Delete (or extend) the lock only if it still holds our token: after an expiry, it may be
# someone else's.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# The value and the milliseconds it has left, in one round trip.
_READ_LUA = """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""
_REFRESH_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class RedisStore:
    """Entries and locks in Redis. The client (and its connection pool) belongs to the caller.

    An operation that outlives `op_timeout` is abandoned, not cancelled (see `deadline`)."""

    shared = True

    def __init__(self, client: redis.asyncio.Redis, op_timeout: float = 0.05) -> None:
        self._client = client
        self._release = client.register_script(_RELEASE_LUA)
        self._refresh = client.register_script(_REFRESH_LUA)
        self._read = client.register_script(_READ_LUA)
        self._deadline = Deadline(op_timeout)

    async def get(self, key: str) -> bytes | None:
        value = await self._run(self._client.get(key))
        if value is not None and not isinstance(value, bytes):
            raise StoreError(f"GET returned {type(value).__name__}")
        return value

    async def read(self, key: str) -> tuple[bytes, int] | None:
        value, left = await self._run(self._read(keys=[key]))
        if value is None:
            return None
        if not isinstance(value, bytes) or not isinstance(left, int):
            raise StoreError(f"GET returned {type(value).__name__}")
        return value, max(left, 0)  # -1: no expiry (not written by us)

    async def set(self, key: str, value: bytes, ttl_ms: int) -> None:
        await self._run(self._client.set(key, value, px=ttl_ms))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        # A pipeline of GETs, not MGET: the keys need not share a cluster slot.
        async with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(key)
            values = await self._run(pipe.execute())
        if any(v is not None and not isinstance(v, bytes) for v in values):
            raise StoreError("GET returned a value that is not bytes")
        return list(values)

    async def set_many(self, items: list[tuple[str, bytes]], ttl_ms: int) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for key, value in items:
                pipe.set(key, value, px=ttl_ms)
            await self._run(pipe.execute())

    async def acquire(self, lock: str, token: str, ttl_ms: int) -> bool:
        return bool(await self._run(self._client.set(lock, token, px=ttl_ms, nx=True)))

    async def refresh(self, lock: str, token: str, ttl_ms: int) -> bool:
        return bool(await self._run(self._refresh(keys=[lock], args=[token, ttl_ms])))

    async def release(self, lock: str, token: str) -> None:
        await self._run(self._release(keys=[lock], args=[token]))

    async def held(self, lock: str) -> bool:
        return bool(await self._run(self._client.exists(lock)))

    async def _run(self, op: Any) -> Any:
        try:
            return await self._deadline.run(op)
        except (TimeoutError, OSError, RedisError) as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
