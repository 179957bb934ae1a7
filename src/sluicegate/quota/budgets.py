"""Budgets: what a managed key may spend per day or month (UTC), in tokens or in cost,
across every replica.

The same reserve-then-settle scheme as the tokens-per-minute limit: admitting a request
reserves what it may cost (its prompt and every token it may produce, priced when the budget
is in cost), refused with a 429 `insufficient_quota` when that would pass the budget; when it
ends, however it ends, the reservation is replaced by what it did cost. Redis holds one
counter per key, period and unit, `<prefix>:budget:{<key id>}:<period>:<unit>`, which expires
a day after the period ends.

Far from the end of a budget, a reservation costs no call to Redis: it is taken from the
headroom this process holds for the key, which was reserved for it in Redis at a sync. Every
`sync_interval` (0.1 s) each process adds in Redis what it charged and gave back, one
pipelined call for all its keys, and takes the headroom it wants until the next sync: twice
what its requests asked of the key since the last one, but at most its part of what is left
before the last tenth of the budget, split by the processes that served the key in the last
ten seconds (a sorted set beside the counter, by the time of each one's last call while it
did). A process whose requests for a key stop gives its headroom back within a second, and all
of it when it closes. Each call says what headroom its process holds (a hash beside the
counter), so that of a process that dies without closing (killed) is taken back by the next
call of another once it has been silent for those ten seconds; what it had admitted from it
since its last sync is lost from the count (at most twice what it admitted in a sync
interval). Since all headroom is reserved in
Redis, what every process admits in memory never passes the budget, however many there are;
and the last tenth (as a request that does not fit the headroom) is reserved in Redis request
by request, atomically against every replica, in the same call that gives back the headroom
its process holds (so a refusal leaves none held there). So what a key is served never passes
its budget but by what a request costs beyond its reservation, and refusals begin within one
request's reservation of it (and of what other processes hold until they spend it or give it
back).

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
from typing import Any, NoReturn

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
_IDLE_SECONDS = 60.0
_HOLD_SYNCS = 10
"""A process holds headroom for a key that had a request within this many syncs."""
_PROCESS_SECONDS = 10.0
"""A process counts among those sharing a key this long after its last call while the key
was in use there (a request within `_HOLD_SYNCS` syncs)."""

# Every change to a counter carries this process's id and a number that grows with each
# change it makes to that counter; a hash beside the counter holds, per process, the last
# number applied. The script applies changes in order and skips those already applied, so a
# change sent again (its reply lost, its caller gone) counts once; then it reserves, if that
# leaves the counter within the limit given.
#
# Another hash holds, per process, the headroom it holds (as it said at its last call, plus
# what this call reserves as headroom): a process gone silent past the window (killed, it
# never gave its headroom back) has it taken back from the counter before it leaves the set
# of processes; what it had admitted from it since is lost from the count. Taken back, it is
# kept under `<process>:reclaimed` and counted again if that process calls again after all
# (cut from Redis that long, it may have admitted from it meanwhile).
#
# KEYS: the counter, its hash of numbers applied, its set of processes (by last call), its
# hash of headroom held.
# ARGV: the counter's TTL, this process's id, the limit, the amount to reserve (0: none),
# its number, now (Unix seconds), how long a process counts after its last call, whether
# this one counts now (1: its key is in use here, 0: only read), the headroom it holds,
# whether the amount reserved is headroom (1) or a request's, then number, amount, ... of
# the changes. Returns {allowed, used after, processes}.
_RESERVE = """
local ttl, process = ARGV[1], ARGV[2]
local now, window = tonumber(ARGV[6]), tonumber(ARGV[7])
local last = tonumber(redis.call('HGET', KEYS[2], process) or '0')
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[8] == '1' then redis.call('ZADD', KEYS[3], now, process) end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - window)) do
  local held = tonumber(redis.call('HGET', KEYS[4], gone) or '0')
  if held > 0 then
    used = used - held
    redis.call('HINCRBY', KEYS[4], gone .. ':reclaimed', held)
  end
  redis.call('HDEL', KEYS[4], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
local reclaimed = tonumber(redis.call('HGET', KEYS[4], process .. ':reclaimed') or '0')
if reclaimed > 0 then
  used = used + reclaimed
  redis.call('HDEL', KEYS[4], process .. ':reclaimed')
end
used = math.max(0, used)
local i = 11
while ARGV[i] do
  local number, amount = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if number > last then
    used = math.max(0, used + amount)
    last = number
  end
  i = i + 2
end
local limit, amount, number = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local allowed = 1
local held = tonumber(ARGV[9])
if number > last then
  if used + amount > limit or (amount == 0 and used >= limit) then
    allowed = 0
  else
    used = used + amount
    last = number
    if ARGV[10] == '1' then held = held + amount end
  end
end
redis.call('SET', KEYS[1], used, 'EX', ttl)
redis.call('HSET', KEYS[2], process, last)
redis.call('EXPIRE', KEYS[2], ttl)
if held > 0 then
  redis.call('HSET', KEYS[4], process, held)
else
  redis.call('HDEL', KEYS[4], process)
end
redis.call('EXPIRE', KEYS[4], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
return {allowed, used, redis.call('ZCARD', KEYS[3])}
"""


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
    """What Redis said was used, reserved and held (every process's headroom) when last
    asked."""
    unsent: int = 0
    """Charged here since, not yet numbered to be added in Redis (negative: given back)."""
    changes: list[tuple[int, int]] = field(default_factory=list)
    """Numbered changes (number, amount), to be applied in Redis; sent again until it
    confirms them."""
    in_changes: int = 0
    """The sum of `changes`' amounts."""
    margin: int = 0
    """What no process holds as headroom: the last tenth of the budget, reserved in Redis
    request by request."""
    headroom: int = 0
    """Reserved in Redis for this process and not yet handed to a request: what it may admit
    in memory."""
    demand: int = 0
    """What requests asked of it since the last sync."""
    processes: int = 1
    """The processes that used the counter lately, as Redis last said."""
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

    @property
    def left(self) -> int:
        """What is left of the budget as this process sees it (its own headroom unspent)."""
        return self.budget.limit - self.used - self.pending + self.headroom

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

    def wanted(self, idle: bool) -> int:
        """The headroom to hold until the next sync: twice what requests asked since the last
        one, within this process's part of what is left before the margin (none when idle)."""
        if idle:
            return 0
        share = (self.budget.limit - self.margin - self.used + self.headroom) // self.processes
        return max(0, min(share, 2 * self.demand))

    def give_back_headroom(self, amount: int) -> None:
        self.headroom -= amount
        self.unsent -= amount

    @property
    def hash(self) -> str:
        return f"{self.name}:applied"

    @property
    def processes_set(self) -> str:
        return f"{self.name}:processes"

    @property
    def held_hash(self) -> str:
        return f"{self.name}:held"


@dataclass(slots=True)
class BudgetHold:
    """One admitted request's reservation against its key's budget."""

    key_id: str
    budget: KeyBudget
    counter: _Counter
    reserved: int
    headers: dict[str, str]
    settled: bool = False


@dataclass(frozen=True, slots=True)
class _Sync:
    """One counter's part of a sync: its changes, and the headroom it asks for (`number`
    0: none)."""

    counter: _Counter
    changes: list[tuple[int, int]]
    in_use: bool
    """Whether the key is in use here: then this process counts among those sharing it."""
    number: int = 0
    amount: int = 0


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
        self._holding_for = _HOLD_SYNCS * self.sync_interval
        self._closing = False
        self._ordered = asyncio.Lock()
        """Numbered changes reach Redis in order: one call that carries numbers at a time (a
        later number applied first would make an earlier reservation look made)."""

    def start(self) -> None:
        self._syncing.start(self._run())

    async def close(self) -> None:
        """Stop, give back every headroom held here, and add in Redis what was charged here
        and not yet sent."""
        await self._syncing.stop()
        self._closing = True
        with contextlib.suppress(*_FAILURES):
            await self.sync()

    # ---- the request path ------------------------------------------------------------------

    def reserve_here(self, key_id: str, budget: KeyBudget, amount: int) -> BudgetHold | None:
        """The reservation, made in this process's memory from the headroom it holds (the
        common case far from the end of the budget: no call to Redis, no await); None when it
        must be made by `reserve`.

        The headroom was reserved in Redis for this process at a sync, so what every process
        admits here never passes the budget, however many share the key. Every request of a
        budgeted key passes here: kept to a few attribute reads."""
        now = self.clock()
        counter = self._current.get(key_id)
        if counter is None or now >= counter.ends or counter.budget is not budget:
            counter = self._counter(key_id, budget, now)
        counter.active = time.monotonic()
        if amount <= 0:
            return None
        counter.demand += amount
        if amount > counter.headroom:
            return None
        counter.headroom -= amount  # reserved in Redis already
        return BudgetHold(key_id, budget, counter, amount, _headers(counter, counter.left))

    async def reserve(self, key_id: str, budget: KeyBudget, amount: int) -> BudgetHold:
        """Reserve `amount` (tokens, or cost in nano-units) of the key's budget: in memory
        from this process's headroom (`reserve_here`), else in Redis; raises
        `BudgetExceededError` when it would pass it."""
        hold = self.reserve_here(key_id, budget, amount)
        if hold is not None:
            return hold
        counter = self._current[key_id]
        if time.monotonic() >= self._down_until:
            allowed = await self._reserve_in_redis(counter, budget, amount)
        else:
            allowed = self._reserve_locally(counter, budget, amount)
        return self._hold(counter, amount, allowed)

    def spent(self, key_id: str, budget: KeyBudget) -> bool:
        """Whether the key's budget was used up when Redis last said (nothing is reserved; no
        call to Redis): a request of it would be refused, whatever it asks."""
        counter = self._current.get(key_id)
        if counter is None:
            return False
        now = self.clock()
        if now >= counter.ends or counter.budget is not budget:
            # A new period (not yet read), or the key's settings reloaded (maybe changed).
            counter = self._counter(key_id, budget, now)
        return counter.synced > -math.inf and counter.left <= 0

    def refuse(self, key_id: str) -> NoReturn:
        """Raise the refusal of a key whose budget is `spent`."""
        raise self._refusal(self._current[key_id], 0)

    def _hold(self, counter: _Counter, amount: int, allowed: bool) -> BudgetHold:
        if not allowed:
            raise self._refusal(counter, amount)
        headers = _headers(counter, max(0, counter.left))
        return BudgetHold(counter.key_id, counter.budget, counter, amount, headers)

    def _refusal(self, counter: _Counter, amount: int) -> BudgetExceededError:
        self.labels.refused_for_budget(counter.key_id)
        budget = counter.budget
        used = budget.limit - counter.left
        return BudgetExceededError(
            f"This API key's budget of {_amount(budget, budget.limit)} {_unit(budget)} per "
            f"{budget.period} is used up ({_amount(budget, used)} used, this request "
            f"may use {_amount(budget, amount)}); it resets at {utc_time(counter.ends)}.",
            headers=_headers(counter, max(0, counter.left)),
        )

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
        take what it cost beyond it), with the next sync. Only the first call counts; no
        await, so a cancellation cannot stop it half way."""
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
        """Reserve in Redis, atomically against every replica, after the changes this
        process has not yet seen confirmed. The headroom this process holds goes back to
        Redis in the same call, too little for this request (a refusal leaves none of the
        budget held here), unless a sync under way brought enough: then it is taken."""
        async with self._ordered:
            if amount <= counter.headroom:
                counter.headroom -= amount
                return True
            counter.give_back_headroom(counter.headroom)
            return await self._reserve_rest(counter, budget, amount)

    async def _reserve_rest(self, counter: _Counter, budget: KeyBudget, amount: int) -> bool:
        """Reserve `amount` in Redis (under `_ordered`). A reservation whose answer does not
        come (Redis down, too slow, the caller gone) may have been made there: it is decided
        here instead, and kept as a numbered change, so that it counts once (or, refused
        here, is given back)."""
        counter.number_unsent()
        number = counter.number()
        changes = list(counter.changes)
        try:
            allowed, used, processes = await self._deadline.run(
                self._reserve(
                    keys=self._keys(counter),
                    args=self._args(
                        counter, budget.limit, amount, number, changes, True, headroom=False
                    ),
                )
            )
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
        self._answered(counter, changes, int(used), int(processes), time.monotonic())
        self._down_until = 0.0
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
        """Send every counter's changes (what was charged here, numbered), take the headroom
        each key in use wants here until the next sync (giving back what it no longer needs),
        and read back what is used; forget the idle counters."""
        async with self._ordered:
            syncs = self._syncs(time.monotonic())
            if not syncs:
                return
            try:
                replies = await self._send(syncs)
            except BaseException:
                for sync in syncs:
                    if sync.number:  # may have been made there: counted once, given back
                        sync.counter.change(sync.number, sync.amount)
                        sync.counter.unsent -= sync.amount
                raise
        moment = time.monotonic()
        for sync, (allowed, used, processes) in zip(syncs, replies, strict=True):
            if sync.number and allowed:
                sync.counter.headroom += sync.amount
            self._answered(sync.counter, sync.changes, int(used), int(processes), moment)
        self._down_until = 0.0

    def _syncs(self, moment: float) -> list[_Sync]:
        """Each counter's part of the next sync (numbered now, under `_ordered`)."""
        syncs = []
        for name, counter in list(self._counters.items()):
            idle = (
                self._closing
                or moment - counter.active > self._holding_for
                or self._current.get(counter.key_id) is not counter
                or self.clock() >= counter.ends
            )
            wanted = counter.wanted(idle)
            counter.demand = 0
            if wanted < counter.headroom:
                counter.give_back_headroom(counter.headroom - wanted)
            counter.number_unsent()
            if moment - counter.active > _IDLE_SECONDS and not counter.changes:
                del self._counters[name]
                if self._current.get(counter.key_id) is counter:
                    del self._current[counter.key_id]
                continue
            more = wanted - counter.headroom
            changes = list(counter.changes)
            if more > 0:
                syncs.append(_Sync(counter, changes, not idle, counter.number(), more))
            else:
                syncs.append(_Sync(counter, changes, not idle))
        return syncs

    async def _send(self, syncs: list[_Sync]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for sync in syncs:
            counter = sync.counter
            # The headroom stays below the margin: the last tenth is reserved request by
            # request, so that no process holds what another's request could use.
            limit = counter.budget.limit - counter.margin
            args = self._args(
                counter, limit, sync.amount, sync.number, sync.changes, sync.in_use, headroom=True
            )
            await self._reserve(keys=self._keys(counter), args=args, client=pipe)
        return list(await self._sync_deadline.run(pipe.execute()))

    def _keys(self, counter: _Counter) -> list[str]:
        return [counter.name, counter.hash, counter.processes_set, counter.held_hash]

    def _args(
        self,
        counter: _Counter,
        limit: int,
        amount: int,
        number: int,
        changes: list[tuple[int, int]],
        in_use: bool,
        headroom: bool,
    ) -> list[int | float | str]:
        """`headroom`: the amount reserved becomes headroom held here (a sync), not a
        request's. The headroom held here is said as it is now: it only shrinks until the
        reply (requests take from it), so Redis never takes back less than is unused."""
        return [
            counter.ttl, self._process, limit, amount, number, time.time(), _PROCESS_SECONDS,
            int(in_use), counter.headroom, int(headroom), *_flat(changes),
        ]  # fmt: skip

    def _answered(
        self,
        counter: _Counter,
        changes: list[tuple[int, int]],
        used: int,
        processes: int,
        moment: float,
    ) -> None:
        """What Redis said of a counter: its changes up to the last sent are applied."""
        counter.applied(changes[-1][0] if changes else 0)
        counter.used, counter.synced, counter.local_since = used, moment, 0
        counter.processes = max(1, processes)
        self.labels.budget_used(counter.key_id, min(1.0, used / counter.budget.limit))

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
