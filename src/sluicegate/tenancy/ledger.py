"""The usage ledger: for each key, model and day (UTC), what was used, written to Redis in
batches off the request path.

`record` adds a settled request to this process's pending totals and returns: nothing on
the request path waits for Redis. Every `flush_interval` a background task writes what is
pending in one script call: `HINCRBY`s on one hash per key and day,
`<prefix>:usage:<day>:<key id>`, whose fields are `<measure>:<model>`, and the key id added to
the day's set, `<prefix>:usage:<day>:keys`; every key written expires after
`retention_days`.

Each batch carries an id, which the script records: a batch sent again after a reply was
lost (a timeout, a connection reset) is not counted twice. A batch that fails is sent again,
before anything newer, until it is written or `give_up_after` seconds have passed since its
first try; then it is dropped, logged, and counted in `sluicegate_usage_lost_total` (by
measure), so that what the ledger holds plus what the metric counts is what was used.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.background import Background
from sluicegate.deadline import Deadline
from sluicegate.observability.metrics import USAGE_BATCHES, USAGE_LOST
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.prices import Price

logger = logging.getLogger(__name__)

MEASURES = (
    "requests",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "errors",
    "cost",
)
"""What the ledger counts; `cost` in nano-units (`prices`)."""
_FAILURES = (TimeoutError, OSError, RedisError)
_BATCH_SEEN_SECONDS = 86400

# KEYS: the batch's id key, then for each (day, key) its hash and its day's set. ARGV: the
# retention in seconds, the number of (day, key) pairs, then for each pair its key id and
# its number of fields, then field, amount... Returns 1, or 0 for a batch written before.
_WRITE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', BATCH_SEEN) then return 0 end
local ttl = tonumber(ARGV[1])
local at = 3
for i = 1, tonumber(ARGV[2]) do
  local hash, set = KEYS[2 * i], KEYS[2 * i + 1]
  local key, fields = ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  for j = 1, fields do
    redis.call('HINCRBY', hash, ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('EXPIRE', hash, ttl)
  redis.call('SADD', set, key)
  redis.call('EXPIRE', set, ttl)
end
return 1
""".replace("BATCH_SEEN", str(_BATCH_SEEN_SECONDS))


def day_of(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d")


_DAY_SECONDS = 86400


Totals = dict[tuple[int, str, str], list[int]]
"""(day, as days since 1970, UTC; key id; model) -> the `MEASURES`."""


@dataclass
class _Batch:
    id: str
    totals: Totals
    first_try: float = field(default_factory=time.monotonic)


class UsageLedger:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str,
        price_of: Callable[[str], Price | None] = lambda model: None,
        flush_interval: float = 0.25,
        retention_days: int = 400,
        give_up_after: float = 600.0,
        op_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._price_of = price_of
        """A model's price, asked at each request (`PriceMemo` keeps the registry's answers
        a while): a price that comes later is counted from then on."""
        self._flush_interval = flush_interval
        self._retention = retention_days * 86400
        self._give_up_after = give_up_after
        self._op_timeout = op_timeout
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        self._deadline = Deadline(op_timeout)
        self._clock = clock
        self._write = client.register_script(_WRITE)
        self._pending: Totals = {}
        self._failed: _Batch | None = None
        self._warning = ThrottledWarning(logger)
        self._writing = Background()

    # ---- the request path ------------------------------------------------------------------

    def record(
        self,
        key_id: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cached: int,
        error: bool,
    ) -> None:
        """Count a settled request (in memory; written with the next batch)."""
        slot = (int(self._clock() // _DAY_SECONDS), key_id, model)
        totals = self._pending.get(slot)
        if totals is None:
            totals = self._pending[slot] = [0] * len(MEASURES)
        totals[0] += 1
        totals[1] += input_tokens
        totals[2] += output_tokens
        totals[3] += cached
        totals[4] += error
        price = self._price_of(model) if model else None
        if price is not None:
            totals[5] += price.cost(input_tokens, output_tokens)

    # ---- writing -----------------------------------------------------------------------------

    def start(self) -> None:
        self._writing.start(self._run())

    async def close(self, wait: float = 2.0) -> None:
        """Stop, and write what is pending (for at most `wait` seconds; what is then left is
        counted as lost)."""
        await self._writing.stop()
        deadline = time.monotonic() + wait
        while (self._failed is not None or self._pending) and time.monotonic() < deadline:
            if not await self.flush():
                await asyncio.sleep(0.1)
        for batch in (self._failed, _Batch("", self._pending)):
            if batch is not None and batch.totals:
                self._lose(batch, "the gateway stopped before it could be written")
        self._failed, self._pending = None, {}

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            await self.flush()

    async def flush(self) -> bool:
        """Write the failed batch, if any, then what is pending; whether all went."""
        if self._failed is None:
            if not self._pending:
                return True
            self._failed, self._pending = _Batch(uuid.uuid4().hex, self._pending), {}
        batch = self._failed
        try:
            await self._send(batch)
        except _FAILURES as exc:
            USAGE_BATCHES.labels("failed").inc()
            if time.monotonic() - batch.first_try > self._give_up_after:
                self._failed = None
                self._lose(batch, f"redis did not answer for {self._give_up_after:.0f} s ({exc})")
            else:
                self._warning.warn("usage ledger: a write failed (%s); it is retried", exc)
            return False
        USAGE_BATCHES.labels("written").inc()
        self._failed = None
        return not self._pending

    async def _send(self, batch: _Batch) -> None:
        grouped: dict[tuple[str, str], list[str | int]] = {}
        for (days, key, model), totals in batch.totals.items():
            fields = grouped.setdefault((day_of(days * _DAY_SECONDS), key), [])
            for measure, amount in zip(MEASURES, totals, strict=True):
                if amount:
                    fields += (f"{measure}:{model}", amount)
        keys = [f"{self._prefix}:usage:batch:{batch.id}"]
        args: list[str | int] = [self._retention, len(grouped)]
        for (day, key), fields in grouped.items():
            keys += (hash_key(self._prefix, day, key), day_set(self._prefix, day))
            args += (key, len(fields) // 2, *fields)
        await self._deadline.run(self._write(keys=keys, args=args))

    def _lose(self, batch: _Batch, why: str) -> None:
        sums = [sum(t[i] for t in batch.totals.values()) for i in range(len(MEASURES))]
        for measure, amount in zip(MEASURES, sums, strict=True):
            if amount:
                USAGE_LOST.labels(measure).inc(amount)
        logger.error(
            "usage ledger: %d requests (%d input and %d output tokens) are lost: %s",
            sums[0],
            sums[1],
            sums[2],
            why,
        )


# ---- where it is kept (`tenancy.usage` reads it) -------------------------------------------


def hash_key(prefix: str, day: str, key: str) -> str:
    return f"{prefix}:usage:{day}:{key}"


def day_set(prefix: str, day: str) -> str:
    return f"{prefix}:usage:{day}:keys"
