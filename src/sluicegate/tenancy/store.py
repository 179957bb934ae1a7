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

What Redis holds is checked, never trusted to be whole. A record that cannot be read or
applied (out of the API's bounds: written around it) is skipped, with an ERROR and
`sluicegate_managed_key_records_skipped_total`; that key is refused, the others are not. A
reload that finds no key at all in Redis while the copy has some, and no deletion in the
change log since the copy was read, is lost data, not a revocation of every key (a Redis
restarted without persistence, a failover, an eviction): the copy is kept, with an ERROR and
`sluicegate_managed_keys_store_lost_total`, until a `restore` (`POST /admin/keys/restore`,
through any process that kept it) writes it back and logs that it did: every process then
ends its keeping. Keys in Redis meanwhile (a backup loaded, a key a new process wrote) do not
end it. While the keys are kept, creating or changing one answers 409 (a key written alone
would be all a process that reloads sees), and deleting one of the copy is logged, so every
process drops it and no restore brings it back.
Nothing else stops the follower: an unexpected error is logged and counted, and the keys are
reloaded whole.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis.asyncio
from pydantic import ValidationError
from redis.exceptions import RedisError

from sluicegate.background import Background
from sluicegate.deadline import Deadline
from sluicegate.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StoreUnavailableError,
)
from sluicegate.keys import KeyPolicy, digest_of, key_id
from sluicegate.observability.metrics import (
    MANAGED_KEY_RECORDS_SKIPPED,
    MANAGED_KEYS,
    MANAGED_KEYS_STORE_LOST,
    MANAGED_KEYS_SYNC_ERRORS,
)
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
_RESTORED = b"restored"
"""The field of the change log's entry that ends a restore (its `id` names no key)."""
_KEYS_LOST = (
    "The key store (Redis) lost its keys; this process keeps its copy of them until they are "
    'restored: POST /admin/keys/restore (docs/keys.md, "When Redis loses the keys"). Until '
    "then keys cannot be created or changed; they can be deleted."
)

# KEYS: the hash, the log. ARGV: id, mode (create, update, delete, revoke), the record, the
# record it replaces (update: compare and set). Returns 1, or 0 (create: taken; update,
# delete: gone), or -1 (update: changed meanwhile). `revoke` deletes a key Redis may not hold
# (lost, kept in the copies): the log says so to every process whatever Redis holds.
_WRITE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local mode = ARGV[2]
if mode == 'create' then
  if current then return 0 end
elseif mode == 'revoke' then
  mode = 'delete'
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
        self._seen = (0, 0)
        """The newest change of the log the copy has read (kept over a failure to read)."""
        self._kept = False
        """Whether a reload found Redis without the copy's keys, and kept them: until a
        restore (here, or logged by another process)."""
        self._changed_here: dict[str, KeyRecord | None] | None = None
        """During a reload: the changes made through this process meanwhile."""
        self._reloaded = 0.0
        self._warning = ThrottledWarning(logger)
        self._errors = ThrottledWarning(logger, level=logging.ERROR)
        self._skips = ThrottledWarning(logger, level=logging.ERROR)
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
        except Exception:
            self._failed_unexpectedly()
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
            except Exception:
                self._failed_unexpectedly()

    def _failed_unexpectedly(self) -> None:
        """A bug, or what Redis holds is not what this code wrote: the follower goes on (a
        follower that ended would leave revocations unapplied here for good)."""
        MANAGED_KEYS_SYNC_ERRORS.inc()
        self._last = None
        self._errors.warn(
            "managed keys: following the key store failed; the keys are reloaded whole",
            exc_info=True,
        )

    async def _reload(self) -> None:
        if self._kept:
            await self._catch_up()
            if self._kept:
                self._lost()
            self._reloaded = time.monotonic()
            return
        # What this process changes meanwhile is newer than what the reload read.
        self._changed_here = {}
        try:
            newest, raw = await self._deadline.run(self._read_all())
            loaded = []
            for i, (name, value) in enumerate(raw.items()):
                record = self._readable(_text(name), value)
                applied = None if record is None else self._applicable(record.id, record)
                if applied is not None:
                    loaded.append(applied)
                if i % _PARSE_CHUNK == _PARSE_CHUNK - 1:
                    await asyncio.sleep(0)
            newest_id = _entry_id(newest[0][0]) if newest else None
            self._kept = not raw and bool(self._by_id) and (newest_id or (0, 0)) <= self._seen
            # Kept until a restore: a key written meanwhile (a new process, a provisioning job)
            # does not replace the copy; the changes logged since are applied to it.
            if self._kept:
                self._lost()
            else:
                self._by_id, self._by_digest, self._policies = {}, {}, {}
                for applied in loaded:
                    self._set(applied[0].id, applied)
                for changed, record in self._changed_here.items():
                    self._apply(changed, record)
        finally:
            self._changed_here = None
        self._last = newest[0][0] if newest else b"0-0"
        if newest_id is not None:
            self._seen = newest_id
        self._reloaded = time.monotonic()

    def _lost(self) -> None:
        """Redis holds no key, the copy has some, and the log says none was deleted."""
        MANAGED_KEYS_STORE_LOST.inc()
        logger.error(
            "managed keys: redis lost the %d keys this process knows, and its change log "
            "does not say they were deleted: taken as lost data (a redis restarted without "
            "persistence, a failover, an eviction). This process keeps its copy, and refuses "
            "to create or change keys, until they are restored (POST /admin/keys/restore; "
            "docs/keys.md)",
            len(self._by_id),
        )

    async def _catch_up(self) -> None:
        """While the keys are kept: the changes logged since the last one the copy read
        (revocations, keys written meanwhile, a restore), applied to the copy."""
        self._last = "{}-{}".format(*self._seen).encode()
        while await self._read_changes() == _BATCH:
            pass

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
            self._apply(changed, None if value is None else self._readable(changed, value))
        if any(_RESTORED in fields for _, fields in entries):
            self._kept = False  # the keys written back were logged before
        self._last = entries[-1][0]
        self._seen = max(self._seen, _entry_id(self._last))
        return len(entries)

    def _apply(self, changed: str, record: KeyRecord | None) -> None:
        """`changed` is now `record` (None: gone). A record whose settings cannot be applied
        is skipped: the key is refused here, as one whose record is gone."""
        self._set(changed, None if record is None else self._applicable(changed, record))

    def _applicable(self, key: str, record: KeyRecord) -> tuple[KeyRecord, KeyPolicy] | None:
        """The record and its policy, or None (skipped) when it cannot be applied."""
        try:
            return record, record.policy()
        except Exception as exc:  # whatever is in Redis: not written by this code
            self._skipped(key, _reason(exc))
            return None

    def _set(self, changed: str, applied: tuple[KeyRecord, KeyPolicy] | None) -> None:
        old = self._by_id.pop(changed, None)
        if old is not None:
            self._by_digest.pop(old.digest, None)
            self._policies.pop(changed, None)
        if applied is not None:
            record, self._policies[changed] = applied
            self._by_id[changed] = record
            self._by_digest[record.digest] = record
        MANAGED_KEYS.set(len(self._by_id))

    def _readable(self, key: str, raw: bytes | str) -> KeyRecord | None:
        record = _parsed(raw)
        if record is None:
            self._skipped(key, "it is not a key record")
        return record

    def _skipped(self, key: str, why: str) -> None:
        MANAGED_KEY_RECORDS_SKIPPED.inc()
        self._skips.warn(
            "managed keys: the record of the key %s in redis cannot be applied (%s); it is "
            "skipped, and the key refused here until its record is written again",
            key,
            why,
        )

    # ---- the admin API -----------------------------------------------------------------------

    async def create(self, settings: KeySettings) -> tuple[KeyRecord, str]:
        """A new key with `settings`: its record and its secret, which is shown once."""
        self._refuse_while_kept()
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

    async def restore(self) -> list[KeyRecord]:
        """Write back the keys this process kept when Redis lost them (`_lost`), each as it
        was (id, digest, settings) and through the change log, so every replica learns of
        it; one Redis has meanwhile is left. Then the log says the restore is done: every
        process ends its keeping of the keys. The keys written."""
        if self._kept:
            try:
                await self._catch_up()  # revocations logged elsewhere: not restored
            except _FAILURES as exc:
                raise _unavailable() from exc
        if not self._kept:
            raise InvalidRequestError(
                "Nothing to restore: this process's keys are in the key store (Redis), or "
                "another process restored them. Only a process that kept its keys when Redis "
                "lost them restores them (docs/keys.md)."
            )
        restored = []
        for record in list(self._by_id.values()):
            if await self._run("create", record.id, record.dumps()) == 1:
                restored.append(record)
        await self._call(
            self._client.xadd(
                self._log, {"id": "", _RESTORED: "1"}, maxlen=LOG_LENGTH, approximate=True
            )
        )
        self._kept = False
        return sorted(restored, key=lambda r: (r.created_at, r.id))

    async def get(self, key: str) -> KeyRecord:
        return (await self._read(key))[0]

    async def _read(self, key: str) -> tuple[KeyRecord, bytes]:
        """The key's record, and as Redis holds it (what an update compares and sets)."""
        raw = await self._call(self._client.hget(self._hash, key))
        record = None if raw is None else _parsed(raw)
        if record is None:
            raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        return record, raw

    async def list(self) -> list[KeyRecord]:
        raw: dict[bytes, bytes] = await self._call(self._client.hgetall(self._hash))
        records = [r for r in map(_parsed, raw.values()) if r is not None]
        return sorted(records, key=lambda r: (r.created_at, r.id))

    async def update(self, key: str, changes: KeySettings) -> KeyRecord:
        self._refuse_while_kept()
        for _ in range(8):
            # Compared with the bytes read, not the record dumped again: one written otherwise
            # (by hand, to be fixed by this update) would never match.
            old, raw = await self._read(key)
            new = old.changed(changes, int(self._clock()))
            written = await self._run("update", key, new.dumps(), raw)
            if written == 1:
                self._changed(key, new)
                return new
            if written == 0:
                raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        raise StoreUnavailableError(f"The key `{key}` kept changing meanwhile; retry.")

    async def delete(self, key: str) -> None:
        """While the keys are kept, one of the copy is revoked whether Redis holds it or not
        (logged: every process drops it, and a restore does not bring it back)."""
        mode = "revoke" if self._kept and key in self._by_id else "delete"
        if await self._run(mode, key) != 1:
            raise NotFoundError(f"No managed key has the id `{key}`.", param="id")
        self._changed(key, None)

    def _refuse_while_kept(self) -> None:
        """A key written while the keys are kept would be in Redis beside none of the others:
        a process that reloads meanwhile would take it for all there is."""
        if self._kept:
            raise ConflictError(_KEYS_LOST, code="managed_keys_lost")

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
        ids = list(dict.fromkeys(_text(f[b"id"]) for _, f in entries if _RESTORED not in f))
        values: Sequence[Any] = await self._client.hmget(self._hash, ids) if ids else []
        return entries, ids, values

    async def _call(self, op: Any) -> Any:
        try:
            return await self._deadline.run(op)
        except _FAILURES as exc:
            raise _unavailable() from exc


def _unavailable() -> StoreUnavailableError:
    return StoreUnavailableError(
        "The key store (Redis) does not answer: keys cannot be read, created or changed now. "
        "Keys already known keep working. Retry later."
    )


def _parsed(raw: bytes | str) -> KeyRecord | None:
    try:
        return KeyRecord.loads(raw)
    except Exception as exc:  # whatever is in Redis: not written by this code
        logger.debug("a managed key record in redis cannot be read: %r", exc)
        return None


def _reason(exc: Exception) -> str:
    """What is wrong with a record's settings, in a line (never their values)."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
    return type(exc).__name__


def _entry_id(entry: bytes | str) -> tuple[int, int]:
    """A stream entry's id (`<ms>-<seq>`), as what orders it."""
    ms, _, seq = _text(entry).partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
