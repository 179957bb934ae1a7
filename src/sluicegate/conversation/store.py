"""Where stored responses live: Redis (shared by replicas, kept across restarts) or a bounded
in-process LRU. Both keep each API key's responses apart: a response stored under one key is
not found under another.

Each entry expires `ttl` seconds after it was written. A store that fails or does not
answer in time raises `StoreUnavailableError` (503); what to do about it is the caller's
decision (a read cannot go on; a write after answering is logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.conversation.record import StoredResponse
from sluicegate.deadline import Deadline
from sluicegate.errors import StoreUnavailableError
from sluicegate.lru import BoundedLRU

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    ttl: float
    """Seconds an entry is kept."""
    max_entry_bytes: int
    """Larger records are not stored."""


class ResponseStore(Protocol):
    shared: bool
    """Whether other processes (replicas, a restarted gateway) see the same entries."""

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None: ...

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        """Store `record`; False when it is larger than the bound (then nothing is kept)."""
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


class MemoryResponseStore:
    """Records bounded by their total size in bytes, least recently used dropped first;
    expired ones dropped when met. Gone with the process, and not seen by other replicas."""

    shared = False

    def __init__(
        self, config: StoreConfig, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._clock = clock
        self._entries: BoundedLRU[tuple[str, str], tuple[float, bytes]] = BoundedLRU(
            max_size=max_bytes
        )

    @property
    def size_bytes(self) -> int:
        return self._entries.size

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None:
        found = self._entries.get((key_id, response_id))
        if found is None:
            return None
        expires, data = found
        if expires <= self._clock():
            self._entries.pop((key_id, response_id))
            return None
        return _decoded(data, response_id)

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        data = record.encode()
        if len(data) > self._config.max_entry_bytes:
            return False
        expires = self._clock() + self._config.ttl
        self._entries.put((key_id, record.id), (expires, data), size=len(data))
        return True

    async def delete(self, key_id: str, response_id: str) -> bool:
        found = self._entries.pop((key_id, response_id))
        return found is not None and found[0] > self._clock()


class RedisResponseStore:
    """Records in Redis under `<prefix>:response:<key id>:<response id>`, with a TTL.
    The client (and its connection pool) belongs to the caller."""

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

    def key(self, key_id: str, response_id: str) -> str:
        return f"{self._prefix}:response:{key_id}:{response_id}"

    async def get(self, key_id: str, response_id: str) -> StoredResponse | None:
        data = await self._run(self._client.get(self.key(key_id, response_id)))
        if data is not None and not isinstance(data, bytes):
            raise StoreUnavailableError(f"The response store answered GET with {type(data)}.")
        return _decoded(data, response_id)

    async def put(self, key_id: str, record: StoredResponse) -> bool:
        data = record.encode()
        if len(data) > self._config.max_entry_bytes:
            return False
        ttl_ms = max(1, int(self._config.ttl * 1000))
        await self._run(self._client.set(self.key(key_id, record.id), data, px=ttl_ms))
        return True

    async def delete(self, key_id: str, response_id: str) -> bool:
        return bool(await self._run(self._client.delete(self.key(key_id, response_id))))

    async def _run(self, op: Any) -> Any:
        try:
            return await self._deadline.run(op)
        except (TimeoutError, OSError, RedisError) as exc:
            logger.warning("response store failed: %s: %s", type(exc).__name__, exc)
            raise StoreUnavailableError() from exc
