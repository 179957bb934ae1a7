"""Budgets: what a managed key may spend per day or month (UTC), in tokens or in cost,
across every replica.

The same reserve-then-settle scheme as the tokens-per-minute limit: admitting a request
reserves what it may cost (its prompt and every token it may produce, priced when the budget
is in cost), refused with a 429 `insufficient_quota` when that would pass the budget; when it
ends, however it ends, the reservation is replaced by what it did cost. Redis holds one
counter per key, period and unit, `<prefix>:budget:{<key id>}:<period>:<unit>`, which expires
a day after the period ends.

Far from the end of a budget, a reservation costs no call to Redis: each process charges it
in memory, and every `sync_interval` (0.1 s) adds what it charged in Redis and reads back
what every replica has used, one pipelined call for all its keys. Near the end (less than a
tenth of the budget left, or less than 64 times the request), or when the last read is more
than three syncs old, each reservation is made in Redis, atomically against every replica:
then what a key is served never passes its budget, and refusals begin within one request's
reservation of it. The fast path's only assumption is that the replicas together do not spend
a tenth of a key's budget between two syncs.

Every change to a counter carries this process's id and a number of its own (one numbered
call to Redis at a time per process, so numbers arrive in order); a hash beside the counter
holds the last number applied per process, so a change sent again after its reply was lost,
or one whose caller gave up waiting (a timeout, a client that left), is counted once: such a
change is kept, and sent again until Redis confirms it.

While Redis does not answer, this replica goes on by itself from the use it last saw: it
admits up to `local_share` of what was then left, and adds what it admitted to Redis when
Redis answers again (`sluicegate_budget_local_decisions_total` counts those decisions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.background import Background
from sluicegate.deadline import Deadline
from sluicegate.errors import BudgetExceededError
from sluicegate.keys import KeyBudget, utc_time
from sluicegate.observability.key_label import KeyLabels
from sluicegate.observability.metrics import BUDGET_LOCAL_DECISIONS
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.prices import units

logger = logging.getLogger(__name__)

_FAILURES = (TimeoutError, OSError, RedisError)
_KEEP_AFTER_PERIOD = 86400
_STALE_SYNCS = 3
"""A counter last read from Redis more syncs ago than this is asked again before a charge."""
_MARGIN_REQUESTS = 64
_IDLE_SECONDS = 60.0

# Every change to a counter carries this process's id and a number that grows with each
# change it makes to that counter; a hash beside the counter holds, per process, the last
# number applied. The scripts apply changes in order and skip those already applied, so a
# change sent again (its reply lost, its caller gone) counts once.
_APPLY = """
local function apply(first)
  local last = tonumber(redis.call('HGET', KEYS[2], ARGV[first]) or '0')
  local used = tonumber(redis.call('GET', KEYS[1]) or '0')
  local i = first + 1
  while ARGV[i] do
    local number, amount = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    if number > last then
      used = math.max(0, used + amount)
      last = number
    end
    i = i + 2
  end
  redis.call('SET', KEYS[1], used, 'EX', ARGV[first - 1])
  redis.call('HSET', KEYS[2], ARGV[first], last)
  redis.call('EXPIRE', KEYS[2], ARGV[first - 1])
  return {used, last}
end
"""

# KEYS: the counter, its hash of numbers applied. ARGV: the counter's TTL, this process's
# id, then number, amount, ... Returns what is used after.
_ADD = (
    _APPLY
    + """
return apply(2)[1]
"""
)

# KEYS: as _ADD. ARGV: the budget, the amount to reserve, its number, what this process has
# charged without a number yet (counted, not written), then as _ADD's. Applies the changes
# first, then reserves. Returns {allowed, used after}. A request whose cost is not known
# before (0) is refused once the budget is used up.
_RESERVE = (
    _APPLY
    + """
local state = apply(6)
local used, last = state[1], state[2]
local limit, amount, number = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if number <= last then return {1, used} end
local seen = used + tonumber(ARGV[4])
if seen + amount > limit or (amount == 0 and seen >= limit) then return {0, used} end
used = used + amount
redis.call('SET', KEYS[1], used, 'EX', ARGV[5])
redis.call('HSET', KEYS[2], ARGV[6], number)
return {1, used}
"""
)


@dataclass(slots=True)
class _Counter:
    """One key's budget in one period, as this process knows it."""

    name: str
    key_id: str
    budget: KeyBudget
    ends: float
    """Unix time its period ends."""
    ttl: int
    reset: str
    """When the period ends, as its header gives it."""
    used: int = 0
    """What Redis said was used (and reserved) when last asked."""
    unsent: int = 0
    """Charged here since, not yet numbered to be added in Redis (negative: given back)."""
    changes: list[tuple[int, int]] = field(default_factory=list)
    """Numbered changes (number, amount), to be applied in Redis; sent again until it
    confirms them."""
    in_changes: int = 0
    """The sum of `changes`' amounts."""
    margin: int = 0
    """What must be left after a reservation made here: a tenth of the budget."""
    numbered: int = 0
    """The last number given to a change."""
    synced: float = -math.inf
    """`time.monotonic()` when Redis last answered for it."""
    active: float = 0.0
    local_since: int = 0
    """What this process admitted by itself since Redis stopped answering."""

    @property
    def pending(self) -> int:
        """Charged here and not known to be in Redis (a change whose reply was lost may be
        counted twice here: the safe side)."""
        return self.unsent + self.in_changes

    def number(self) -> int:
        self.numbered += 1
        return self.numbered

    def change(self, number: int, amount: int) -> None:
        self.changes.append((number, amount))
        self.in_changes += amount

    def number_unsent(self) -> None:
        """What was charged here becomes a numbered change."""
        if self.unsent:
            self.change(self.number(), self.unsent)
            self.unsent = 0

    def applied(self, up_to: int) -> None:
        self.changes = [c for c in self.changes if c[0] > up_to]
        self.in_changes = sum(amount for _, amount in self.changes)

    def set_budget(self, budget: KeyBudget) -> None:
        self.budget = budget
        self.margin = budget.limit // 10

    @property
    def hash(self) -> str:
        return f"{self.name}:applied"


@dataclass(slots=True)
class BudgetHold:
    """One admitted request's reservation against its key's budget."""

    key_id: str
    budget: KeyBudget
    counter: _Counter
    reserved: int
    headers: dict[str, str]
    settled: bool = False


@dataclass
class BudgetKeeper:
    client: redis.asyncio.Redis
    prefix: str = "sluicegate"
    op_timeout: float = 0.25
    local_share: float = 1.0
    retry_interval: float = 1.0
    sync_interval: float = 0.1
    """Seconds between two writes of what was charged here (and reads of what is used)."""
    labels: KeyLabels = field(default_factory=KeyLabels)
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._reserve = self.client.register_script(_RESERVE)
        self._add = self.client.register_script(_ADD)
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        self._deadline = Deadline(self.op_timeout)
        self._sync_deadline = Deadline(self.op_timeout * 4)
        self._counters: dict[str, _Counter] = {}
        """By Redis key: the counters in use lately (and those with changes to send)."""
        self._current: dict[str, _Counter] = {}
        """Each key's counter for its budget's current period (a changed budget, a new
        `KeyBudget`, looks its counter up again)."""
        self._down_until = 0.0
        self._warning = ThrottledWarning(logger)
        self._syncing = Background()
        self._process = uuid.uuid4().hex
        """This process's id in the counters' hashes of changes applied."""
        self._stale_after = _STALE_SYNCS * self.sync_interval
        self._ordered = asyncio.Lock()
        """Numbered changes reach Redis in order: one call that carries numbers at a time (a
        later number applied first would make an earlier reservation look made)."""

    def start(self) -> None:
        self._syncing.start(self._run())

    async def close(self) -> None:
        """Stop, and add in Redis what was charged here and not yet sent."""
        await self._syncing.stop()
        with contextlib.suppress(*_FAILURES):
            await self.sync()

    # ---- the request path ------------------------------------------------------------------

    def reserve_here(self, key_id: str, budget: KeyBudget, amount: int) -> BudgetHold | None:
        """The reservation, made in this process's memory when the key is far from the end
        of its budget (the common case: no call to Redis, no await); None when it must be
        made by `reserve`.

        Far from the end: what Redis said lately, plus what was charged here since, leaves
        a margin that the other replicas cannot spend before the next sync (a tenth of the
        budget, and 64 such requests). Every request of a budgeted key passes here: kept to
        a few attribute reads."""
        now = self.clock()
        counter = self._current.get(key_id)
        if counter is None or now >= counter.ends or counter.budget is not budget:
            counter = self._counter(key_id, budget, now)
        moment = counter.active = time.monotonic()
        if amount <= 0 or moment - counter.synced > self._stale_after:
            return None
        left = budget.limit - counter.used - counter.unsent - counter.in_changes - amount
        if left < counter.margin or left < _MARGIN_REQUESTS * amount:
            return None
        counter.unsent += amount  # added in Redis with the next sync
        return BudgetHold(key_id, budget, counter, amount, _headers(counter, left))

    async def reserve(self, key_id: str, budget: KeyBudget, amount: int) -> BudgetHold:
        """Reserve `amount` (tokens, or cost in nano-units) of the key's budget: in memory
        far from its end (`reserve_here`), in Redis near it; raises `BudgetExceededError`
        when it would pass it."""
        hold = self.reserve_here(key_id, budget, amount)
        if hold is not None:
            return hold
        counter = self._current[key_id]
        if time.monotonic() >= self._down_until:
            allowed = await self._reserve_in_redis(counter, budget, amount)
        else:
            allowed = self._reserve_locally(counter, budget, amount)
        return self._hold(counter, amount, allowed)

    def _hold(self, counter: _Counter, amount: int, allowed: bool) -> BudgetHold:
        budget = counter.budget
        used = counter.used + counter.pending
        headers = _headers(counter, max(0, budget.limit - used))
        if not allowed:
            self.labels.refused_for_budget(counter.key_id)
            raise BudgetExceededError(
                f"This API key's budget of {_amount(budget, budget.limit)} {_unit(budget)} per "
                f"{budget.period} is used up ({_amount(budget, used)} used, this request "
                f"may use {_amount(budget, amount)}); it resets at {utc_time(counter.ends)}.",
                headers=headers,
            )
        return BudgetHold(counter.key_id, budget, counter, amount, headers)

    def _counter(self, key_id: str, budget: KeyBudget, now: float) -> _Counter:
        """The key's counter for the period `now` is in (made when the period begins), as
        the key's current one."""
        period, ends = _period(budget, now)
        name = f"{self.prefix}:budget:{{{key_id}}}:{period}:{budget.unit}"
        counter = self._counters.get(name)
        if counter is None:
            ttl = math.ceil(ends - now) + _KEEP_AFTER_PERIOD
            counter = self._counters[name] = _Counter(
                name, key_id, budget, ends, ttl, utc_time(ends)
            )
        # The key's settings as they are now (a reload of the keys makes new objects; a
        # change may have raised or lowered the limit).
        counter.set_budget(budget)
        self._current[key_id] = counter
        return counter

    def settle(self, hold: BudgetHold, used: int) -> None:
        """The request ended having cost `used`: give back the rest of its reservation (or
        take what it cost beyond it), with the next sync. Only the first call counts."""
        if hold.settled:
            return
        hold.settled = True
        delta = used - hold.reserved
        # Its counter, even if it was forgotten while the request ran (idle, or its period
        # ended): what is given back must reach Redis.
        counter = self._counters.setdefault(hold.counter.name, hold.counter)
        counter.unsent += delta
        counter.active = time.monotonic()
        if counter.active < self._down_until:
            counter.local_since += delta

    async def _reserve_in_redis(self, counter: _Counter, budget: KeyBudget, amount: int) -> bool:
        """Near the end: reserve in Redis, atomically against every replica, after the
        changes this process has not yet seen confirmed. A reservation whose answer does not
        come (Redis down, too slow, the caller gone) may have been made there: it is decided
        here instead, and kept as a numbered change, so that it counts once (or, refused
        here, is given back)."""
        await self._ordered.acquire()
        counter.number_unsent()
        number = counter.number()
        changes = list(counter.changes)
        try:
            allowed, used = await self._deadline.run(
                self._reserve(
                    keys=[counter.name, counter.hash],
                    args=[budget.limit, amount, number, 0, counter.ttl, self._process,
                          *_flat(changes)],
                )
            )  # fmt: skip
        except BaseException as exc:
            counter.change(number, amount)  # made there at most once
            failed = isinstance(exc, _FAILURES)
            admitted = False
            if failed:
                self._failed(exc)
                admitted = self._reserve_locally(counter, budget, amount, charge=False)
            if not admitted:
                counter.unsent -= amount  # refused here: given back if it was made there
            if failed:
                return admitted
            raise
        finally:
            self._ordered.release()
        counter.applied(changes[-1][0] if changes else 0)
        counter.used, counter.synced, counter.local_since = int(used), time.monotonic(), 0
        self._down_until = 0.0
        self._seen(counter)
        return bool(allowed)

    def _reserve_locally(
        self, counter: _Counter, budget: KeyBudget, amount: int, charge: bool = True
    ) -> bool:
        """Redis does not answer: this process's share of what was left when it last did.
        `charge`: the amount is to be added in Redis (unless a change sent for it already)."""
        BUDGET_LOCAL_DECISIONS.inc()
        share = math.floor(self.local_share * max(0, budget.limit - counter.used))
        if counter.local_since + amount > share or (amount <= 0 and counter.local_since >= share):
            return False
        counter.local_since += amount
        if charge:
            counter.unsent += amount
        return True

    # ---- syncing -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            if time.monotonic() < self._down_until:
                continue
            try:
                await self.sync()
            except _FAILURES as exc:
                self._failed(exc)

    async def sync(self) -> None:
        """Send every counter's changes (what was charged here, numbered), and read back
        what is used, for every counter in use lately; forget the idle ones."""
        moment = time.monotonic()
        counters = []
        for name, counter in list(self._counters.items()):
            counter.number_unsent()
            if moment - counter.active > _IDLE_SECONDS and not counter.changes:
                del self._counters[name]
                if self._current.get(counter.key_id) is counter:
                    del self._current[counter.key_id]
            else:
                counters.append((counter, list(counter.changes)))
        if not counters:
            return
        async with self._ordered:
            replies = await self._send(counters)
        moment = time.monotonic()
        for (counter, changes), used in zip(counters, replies, strict=True):
            counter.applied(changes[-1][0] if changes else 0)
            counter.used, counter.synced, counter.local_since = int(used), moment, 0
            self._seen(counter)
        self._down_until = 0.0

    async def _send(self, counters: list[tuple[_Counter, list[tuple[int, int]]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for counter, changes in counters:
            args: list[int | str] = [counter.ttl, self._process, *_flat(changes)]
            await self._add(keys=[counter.name, counter.hash], args=args, client=pipe)
        return list(await self._sync_deadline.run(pipe.execute()))

    def _seen(self, counter: _Counter) -> None:
        """What Redis said of a counter, on the dashboard (`sluicegate_budget_used_ratio`)."""
        self.labels.budget_used(counter.key_id, min(1.0, counter.used / counter.budget.limit))

    def _failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self.retry_interval
        self._warning.warn(
            "budget store failed (%s); each key may use this replica's share (%.0f%%) of what "
            "it had left until Redis answers",
            exc,
            self.local_share * 100,
        )


def _flat(changes: list[tuple[int, int]]) -> list[int]:
    return [value for change in changes for value in change]


def _period(budget: KeyBudget, now: float) -> tuple[str, float]:
    """The period `now` is in, and the Unix time it ends."""
    at = datetime.fromtimestamp(now, UTC)
    if budget.period == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), start.timestamp() + 86400
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else (start.replace(month=start.month + 1))
    )
    return start.strftime("%Y-%m"), following.timestamp()


_REMAINING = "x-sluicegate-budget-remaining"
_RESET = "x-sluicegate-budget-reset"


def _headers(counter: _Counter, left: int) -> dict[str, str]:
    """What remains of the budget after a request's reservation (`left`, not below 0), and
    when it resets."""
    return {_REMAINING: _amount(counter.budget, left), _RESET: counter.reset}


def _amount(budget: KeyBudget, amount: int) -> str:
    return str(amount) if budget.unit == "tokens" else f"{units(amount):.6f}"


def _unit(budget: KeyBudget) -> str:
    return "tokens" if budget.unit == "tokens" else "in cost"
