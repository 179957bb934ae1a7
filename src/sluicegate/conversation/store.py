"""Where stored responses live: Redis (shared by replicas, kept across restarts) or this
process, bounded in bytes. Both keep each API key's responses apart: a response stored under
one key is not found under another.

Each key's records add up to at most `max_key_bytes`: a key past it loses its own oldest
records (oldest written first), never another key's, so one key storing large conversations
cannot push every other key's out (68 records of 1 MB once did, in process). A record larger
than the bound, or than `max_entry_bytes`, is not stored.

Each entry expires `ttl` seconds after it was written. A store that fails or does not
answer in time raises `StoreUnavailableError` (503); what to do about it is the caller's
decision (a read cannot go on; a write after answering is logged).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.conversation.record import StoredResponse
from sluicegate.deadline import Deadline
from sluicegate.errors import StoreUnavailableError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    ttl: float
    """Seconds an entry is kept."""
    max_entry_bytes: int
    """Larger records are not stored."""
    max_key_bytes: int | None = None
    """Bytes of records one API key may hold; None: no bound per key."""

    def takes(self, size: int) -> bool:
        """Whether a record of `size` bytes may be stored at all."""
        key_bound = self.max_key_bytes
        return size <= self.max_entry_bytes and (key_bound is None or size <= key_bound)


class ResponseStore(Protocol):
    shared: bool
    """Whether other processes (replicas, a restarted gateway) see the same entries."""

    def takes(self, size: int) -> bool:
        """Whether a record of `size` bytes can be stored at all."""
        ...

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None: ...

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        """Store `record`, dropping the key's oldest records as its bound needs; False when
        it is larger than a bound (then nothing is kept)."""
        ...

    async def delete(self, key_id: str, response_id: str) -> bool:
        """Whether there was such a response."""
        ...


def _decoded(data: bytes | None, response_id: str) -> StoredResponse | None:
    if data is None:
        return None
    try:
        return StoredResponse.decode(data)
    except ValueError:
        logger.warning("stored response %s is corrupt; treated as absent", response_id)
        return None


@dataclass(slots=True)
class _Held:
    """One key's records, oldest written first, each with its expiry time."""

    records: OrderedDict[str, tuple[float, bytes]] = field(default_factory=OrderedDict)
    size: int = 0


class MemoryResponseStore:
    """Records bounded by their size in bytes, per key and in all: a key past its bound
    loses its own oldest records; past `max_bytes`, the key holding the most bytes loses its
    oldest. Expired ones dropped when met. Gone with the process, and not seen by other
    replicas."""

    shared = False

    def __init__(
        self, config: StoreConfig, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._max_bytes = max_bytes
        self._clock = clock
        self._keys: dict[str, _Held] = {}
        self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def key_bytes(self, key_id: str) -> int:
        held = self._keys.get(key_id)
        return 0 if held is None else held.size

    def takes(self, size: int) -> bool:
        return self._config.takes(size) and size <= self._max_bytes

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None:
        held = self._keys.get(key_id)
        found = None if held is None else held.records.get(response_id)
        if found is None:
            return None
        expires, data = found
        if expires <= self._clock():
            self._drop(key_id, response_id)
            return None
        return _decoded(data, response_id)

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        data = record.encode()
        size = len(data)
        if not self.takes(size):
            return False
        self._drop(key_id, record.id)
        bound = self._config.max_key_bytes
        while bound is not None and self.key_bytes(key_id) + size > bound:
            self._drop_oldest(key_id)
        while self._size + size > self._max_bytes:
            self._drop_oldest(max(self._keys, key=self.key_bytes))
        held = self._keys.setdefault(key_id, _Held())
        held.records[record.id] = (self._clock() + self._config.ttl, data)
        held.size += size
        self._size += size
        return True

    async def delete(self, key_id: str, response_id: str) -> bool:
        found = self._drop(key_id, response_id)
        return found is not None and found[0] > self._clock()

    def _drop(self, key_id: str, response_id: str) -> tuple[float, bytes] | None:
        held = self._keys.get(key_id)
        found = None if held is None else held.records.pop(response_id, None)
        if held is not None and found is not None:
            self._forget(key_id, held, len(found[1]))
        return found

    def _drop_oldest(self, key_id: str) -> None:
        held = self._keys[key_id]
        _, (_, data) = held.records.popitem(last=False)
        self._forget(key_id, held, len(data))

    def _forget(self, key_id: str, held: _Held, size: int) -> None:
        held.size -= size
        self._size -= size
        if not held.records:
            del self._keys[key_id]


# The key's bookkeeping: KEYS are its ids by write time (a sorted set, scored in server
# microseconds, each after the last), their sizes (a hash), their byte total, then the
# record's key. Every key
# involved holds the API key id as its hash tag, so one Redis Cluster slot has them all, as
# scripts need; the records dropped are named from ARGV[1], in that slot too.
_FORGET_LUA = """
local ids, sizes, total = KEYS[1], KEYS[2], KEYS[3]
local held = tonumber(redis.call('GET', total) or 0)
local function forget(member)
  held = held - tonumber(redis.call('HGET', sizes, member) or 0)
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', ids, member)
  return redis.call('DEL', ARGV[1] .. member)
end
"""

# ARGV: the records' key prefix, the response id, the record, the TTL and the key's bound
# (0: none). Drops the key's expired ids, then its oldest records while the new one does not
# fit, then stores it; the bookkeeping expires with the key's newest record. Returns the
# number of records dropped.
_PUT_LUA = (
    _FORGET_LUA
    + """
local id, data = ARGV[2], ARGV[3]
local ttl, bound = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for _, member in ipairs(redis.call('ZRANGEBYSCORE', ids, '-inf', now - ttl * 1000)) do
  forget(member)
end
-- Equal scores would order by id: a write in the same microsecond comes after the last.
local last = redis.call('ZRANGE', ids, -1, -1, 'WITHSCORES')[2]
if last and tonumber(last) >= now then
  now = tonumber(last) + 1
end
forget(id)
local size, dropped = string.len(data), 0
while bound > 0 and held + size > bound do
  local oldest = redis.call('ZRANGE', ids, 0, 0)[1]
  if not oldest then break end
  dropped = dropped + forget(oldest)
end
if held < 0 or redis.call('ZCARD', ids) == 0 then
  held = 0
end
redis.call('SET', KEYS[4], data, 'PX', ttl)
redis.call('ZADD', ids, string.format('%.0f', now), id)
redis.call('HSET', sizes, id, size)
redis.call('SET', total, held + size, 'PX', ttl)
redis.call('PEXPIRE', ids, ttl)
redis.call('PEXPIRE', sizes, ttl)
return dropped
"""
)

# ARGV: the records' key prefix, the response id. Returns 1 if the record was there.
_DELETE_LUA = (
    _FORGET_LUA
    + """
local found = forget(ARGV[2])
if redis.call('ZCARD', ids) == 0 then
  redis.call('DEL', ids, sizes, total)
elseif redis.call('EXISTS', total) == 1 then
  redis.call('SET', total, math.max(held, 0), 'KEEPTTL')
end
return found
"""
)


class RedisResponseStore:
    """Records in Redis under `<prefix>:response:{<key id>}:<response id>`, with a TTL, and
    each key's bookkeeping under `<prefix>:responses:{<key id>}:…` (ids, sizes, total), kept
    by Lua scripts so that replicas writing at once keep the bound. The client (and its
    connection pool) belongs to the caller."""

    shared = True

    def __init__(
        self,
        client: redis.asyncio.Redis,
        config: StoreConfig,
        prefix: str = "sluicegate",
        op_timeout: float = 0.5,
    ) -> None:
        self._client = client
        self._config = config
        self._prefix = prefix
        self._deadline = Deadline(op_timeout)
        self._put = client.register_script(_PUT_LUA)
        self._delete = client.register_script(_DELETE_LUA)

    def takes(self, size: int) -> bool:
        return self._config.takes(size)

    def key(self, key_id: str, response_id: str) -> str:
        return f"{self._records(key_id)}{response_id}"

    def legacy_key(self, key_id: str, response_id: str) -> str:
        """Where records were kept before the per-key bound (no hash tag): still read and
        deleted, until they expire (`RESPONSES_TTL_SECONDS` after the upgrade at most)."""
        return f"{self._prefix}:response:{key_id}:{response_id}"

    def bookkeeping(self, key_id: str) -> list[str]:
        """The key's ids by write time, their sizes and their total, in the scripts' order."""
        base = f"{self._prefix}:responses:{{{key_id}}}"
        return [f"{base}:ids", f"{base}:sizes", f"{base}:bytes"]

    def _records(self, key_id: str) -> str:
        return f"{self._prefix}:response:{{{key_id}}}:"

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None:
        data = await self._run(self._client.get(self.key(key_id, response_id)))
        if data is None:
            data = await self._run(self._client.get(self.legacy_key(key_id, response_id)))
        if data is not None and not isinstance(data, bytes):
            raise StoreUnavailableError(f"The response store answered GET with {type(data)}.")
        return _decoded(data, response_id)

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        data = record.encode()
        if not self.takes(len(data)):
            return False
        ttl_ms = max(1, int(self._config.ttl * 1000))
        keys = [*self.bookkeeping(key_id), self.key(key_id, record.id)]
        bound = self._config.max_key_bytes or 0
        args: list[str | bytes | int] = [self._records(key_id), record.id, data, ttl_ms, bound]
        await self._run(self._put(keys=keys, args=args))
        return True

    async def delete(self, key_id: str, response_id: str) -> bool:
        args = [self._records(key_id), response_id]
        if await self._run(self._delete(keys=self.bookkeeping(key_id), args=args)):
            return True
        return bool(await self._run(self._client.delete(self.legacy_key(key_id, response_id))))

    async def _run(self, op: Any) -> Any:
        try:
            return await self._deadline.run(op)
        except (TimeoutError, OSError, RedisError) as exc:
            logger.warning("response store failed: %s: %s", type(exc).__name__, exc)
            raise StoreUnavailableError() from exc
