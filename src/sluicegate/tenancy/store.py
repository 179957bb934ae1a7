"""Managed API keys: created, changed and revoked at run time through `/admin/keys`, kept in
Redis as digests, known to every replica within a second.

Redis holds one hash, `<prefix>:keys`, of key id to `KeyRecord` (the key's SHA-256 and its
settings; never the key), and a stream, `<prefix>:keys:log`, with the id of each key written.
Every change is one script that writes the hash and appends to the stream together.

Each process keeps its own copy of every key, which the request path reads (`find`,
`policy`) without a call to Redis. A background task reads the stream every `sync_interval`
(a quarter of a second by default) and fetches the keys it names; a whole reload happens at
start, after any failure to read, and every `reload_interval` as a backstop. A change made
through this process is applied to its copy at once.

While Redis does not answer, the copy stays as it was: known keys keep working with their
last settings, and creating or changing a key answers 503 `store_unavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.background import Background
from sluicegate.deadline import Deadline
from sluicegate.errors import NotFoundError, StoreUnavailableError
from sluicegate.keys import KeyPolicy, digest_of, key_id
from sluicegate.observability.metrics import MANAGED_KEYS
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.tenancy.records import KeyRecord
from sluicegate.wire.admin_keys import KeySettings

logger = logging.getLogger(__name__)

SECRET_PREFIX = "sk-sg-"
LOG_LENGTH = 100_000
"""Entries the change stream keeps (about): far more than the changes of one sync interval.
A process that could not read it for a while reloads whole (any failure to read does)."""
_BATCH = 1000
_PARSE_CHUNK = 500
"""Records parsed between yields to the event loop, on a whole reload."""
_FAILURES = (TimeoutError, OSError, RedisError)

# KEYS: the hash, the log. ARGV: id, mode (create, update, delete), the record, the record
# it replaces (update: compare and set). Returns 1, or 0 (create: taken; update, delete:
# gone), or -1 (update: changed meanwhile).
_WRITE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local mode = ARGV[2]
if mode == 'create' then
  if current then return 0 end
elseif not current then
  return 0
elseif mode == 'update' and current ~= ARGV[4] then
  return -1
end
if mode == 'delete' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'id', ARGV[1])
return 1
"""


class KeyStore:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str,
        reserved_ids: Iterable[str] = (),
        sync_interval: float = 0.25,
        reload_interval: float = 30.0,
        op_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`reserved_ids`: the ids of the keys of the settings, which a new key may not take."""
        self._client = client
        self._hash = f"{prefix}:keys"
        self._log = f"{prefix}:keys:log"
        self._write = client.register_script(_WRITE)
        self._reserved = frozenset(reserved_ids)
        self._sync_interval = sync_interval
        self._reload_interval = reload_interval
        self._op_timeout = op_timeout
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        self._deadline = Deadline(op_timeout)
        self._clock = clock
        self._by_id: dict[str, KeyRecord] = {}
        self._by_digest: dict[bytes, KeyRecord] = {}
        self._policies: dict[str, KeyPolicy] = {}
        self._last: bytes | None = None
        """The last change read from the log; None: reload whole."""
        self._changed_here: dict[str, KeyRecord | None] | None = None
        """During a reload: the changes made through this process meanwhile."""
        self._reloaded = 0.0
        self._warning = ThrottledWarning(logger)
        self._following = Background()

    # ---- the request path ------------------------------------------------------------------

    def find(self, digest: bytes) -> KeyRecord | None:
        """The managed key whose digest is `digest`, if any (expired or not)."""
        return self._by_digest.get(digest)

    def policy(self, key: str) -> KeyPolicy | None:
        """The settings of the managed key with id `key`, if it is one."""
        return self._policies.get(key)

    def expired(self, record: KeyRecord) -> bool:
        expires = record.settings.get("expires_at")
        return expires is not None and self._clock() >= expires

    def __len__(self) -> int:
        return len(self._by_id)

    # ---- following Redis -------------------------------------------------------------------

    async def start(self) -> None:
        """Load every key (start-up goes on without them if Redis does not answer: they come
        when it does), then follow the changes."""
        try:
            await self._reload()
        except _FAILURES as exc:
            self._warning.warn("managed keys not loaded (%s): they work once redis answers", exc)
        self._following.start(self._follow())

    async def close(self) -> None:
        await self._following.stop()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self._sync_interval)
            try:
                if self._last is None or time.monotonic() - self._reloaded > self._reload_interval:
                    await self._reload()
                else:
                    while await self._read_changes() == _BATCH:
                        pass
            except _FAILURES as exc:
                self._last = None  # what was missed meanwhile: reload whole
                self._warning.warn(
                    "managed keys: redis does not answer (%s); %d known keys keep their last "
                    "settings",
                    exc,
                    len(self._by_id),
                )

    async def _reload(self) -> None:
        # What this process changes meanwhile is newer than what the reload read.
        self._changed_here = {}
        try:
            newest, raw = await self._deadline.run(self._read_all())
            records = []
            for i, value in enumerate(raw.values()):
                records.append(_parsed(value))
                if i % _PARSE_CHUNK == _PARSE_CHUNK - 1:
                    await asyncio.sleep(0)
            self._by_id, self._by_digest, self._policies = {}, {}, {}
            for record in records:
                if record is not None:
                    self._apply(record.id, record)
            for changed, record in self._changed_here.items():
                self._apply(changed, record)
        finally:
            self._changed_here = None
        self._last = newest[0][0] if newest else b"0-0"
        self._reloaded = time.monotonic()

    async def _read_all(self) -> tuple[Any, dict[Any, Any]]:
        """The log's newest entry, and every record."""
        newest: Any = await self._client.xrevrange(self._log, count=1)
        raw: dict[Any, Any] = await self._client.hgetall(self._hash)
        return newest, raw

    async def _read_changes(self) -> int:
        """Apply the changes logged since the last read; how many were read."""
        assert self._last is not None
        read = await self._deadline.run(self._read_logged(self._last))
        if read is None:
            return 0
        entries, ids, values = read
        for changed, value in zip(ids, values, strict=True):
            self._apply(changed, None if value is None else _parsed(value))
        self._last = entries[-1][0]
        return len(entries)

    def _apply(self, changed: str, record: KeyRecord | None) -> None:
        old = self._by_id.pop(changed, None)
        if old is not None:
            self._by_digest.pop(old.digest, None)
            self._policies.pop(changed, None)
        if record is not None:
            self._by_id[changed] = record
            self._by_digest[record.digest] = record
            self._policies[changed] = record.policy()
        MANAGED_KEYS.set(len(self._by_id))

    # ---- the admin API -----------------------------------------------------------------------

    async def create(self, settings: KeySettings) -> tuple[KeyRecord, str]:
        """A new key with `settings`: its record and its secret, which is shown once."""
        for _ in range(8):
            secret = SECRET_PREFIX + secrets.token_urlsafe(32)
            digest = digest_of(secret)
            new = KeyRecord.new(key_id(digest), digest, settings, int(self._clock()))
            if new.id in self._reserved:
                continue
            if await self._run("create", new.id, new.dumps()) == 1:
                self._changed(new.id, new)
                return new, secret
        raise StoreUnavailableError("No free key id was found; retry.")

    async def get(self, key: str) -> KeyRecord:
        raw = await self._call(self._client.hget(self._hash, key))
        record = None if raw is None else _parsed(raw)
        if record is None:
            raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        return record

    async def list(self) -> list[KeyRecord]:
        raw: dict[bytes, bytes] = await self._call(self._client.hgetall(self._hash))
        records = [r for r in map(_parsed, raw.values()) if r is not None]
        return sorted(records, key=lambda r: (r.created_at, r.id))

    async def update(self, key: str, changes: KeySettings) -> KeyRecord:
        for _ in range(8):
            old = await self.get(key)
            new = old.changed(changes, int(self._clock()))
            written = await self._run("update", key, new.dumps(), old.dumps())
            if written == 1:
                self._changed(key, new)
                return new
            if written == 0:
                raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        raise StoreUnavailableError(f"The key `{key}` kept changing meanwhile; retry.")

    async def delete(self, key: str) -> None:
        if await self._run("delete", key) != 1:
            raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        self._changed(key, None)

    def _changed(self, changed: str, record: KeyRecord | None) -> None:
        """A change made through this process: known here at once (and kept over a reload
        that read Redis before it)."""
        self._apply(changed, record)
        if self._changed_here is not None:
            self._changed_here[changed] = record

    async def _run(self, mode: str, key: str, record: bytes = b"", old: bytes = b"") -> int:
        reply = await self._call(
            self._write(keys=[self._hash, self._log], args=[key, mode, record, old, LOG_LENGTH])
        )
        return int(reply)

    async def _read_logged(self, last: Any) -> tuple[Any, Sequence[str], Sequence[Any]] | None:
        """The log's entries after `last`, the ids they name and those ids' records."""
        reply: Any = await self._client.xread({self._log: last}, count=_BATCH)
        if not reply:
            return None
        entries = reply[0][1]
        ids = list(dict.fromkeys(_text(fields[b"id"]) for _, fields in entries))
        values: Sequence[Any] = await self._client.hmget(self._hash, ids)
        return entries, ids, values

    async def _call(self, op: Any) -> Any:
        try:
            return await self._deadline.run(op)
        except _FAILURES as exc:
            raise StoreUnavailableError(
                "The key store (Redis) does not answer: keys cannot be read, created or changed "
                "now. Keys already known keep working. Retry later."
            ) from exc


def _parsed(raw: bytes | str) -> KeyRecord | None:
    try:
        return KeyRecord.loads(raw)
    except (ValueError, KeyError, TypeError) as exc:
        logger.error("a managed key record in redis cannot be read (%s); it is ignored", exc)
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
