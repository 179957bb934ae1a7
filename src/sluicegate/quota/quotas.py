"""Which rate limit applies to which API key, what a request is charged, and the 429s.

The limiter (`redis_limiter` or `memory_limiter`) keeps the state; this module picks the
limit for a key (its override, else the default) and turns a refusal into `RateLimitError`.

A request is let in twice. First, before any work proportional to its body (parsing,
templates, tokenizing, a stored conversation, schemas), by what costs nothing to check
(`enter`): the request is counted against its key's requests per minute, and refused if the
key already holds its whole share of the engine, or its budget was used up when this process
last saw it. So a key over its limits costs one check per request, however large its
requests. Then, once its prompt is known, it is admitted with its possible cost reserved
(`reserve`): its prompt tokens (an estimate for those no tokenizer here counts) and every
completion token it may produce (sequences × max_tokens), plus its sequences in the key's
share of the engine (`share`). When it ends, however it ends, its `Reservation` is released
with what the engine did: the prompt tokens it took up (none for a run that never began: one
refused or failed before its first step, or a client gone first) and the completion tokens it
produced. These are charged instead of the reservation, once, and the sequences come free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from sluicegate.errors import KeyRateLimitError, RateLimitError
from sluicegate.keys import KeyBudget, KeyPolicy
from sluicegate.observability.metrics import RATE_LIMITED
from sluicegate.prices import Price
from sluicegate.quota.budgets import BudgetHold, BudgetKeeper
from sluicegate.quota.share import KeyShare, SequenceShare
from sluicegate.quota.window import Decision, RateLimit, RateLimiter

Policies = Callable[[str], KeyPolicy | None]
"""A managed key's settings by its id (`tenancy.store.KeyStore.policy`)."""


def no_policies(key_id: str) -> KeyPolicy | None:
    return None


@dataclass(frozen=True, slots=True)
class ModelQuota:
    """A model's own limits, across every key (`rate_limit` in the models file)."""

    name: str
    limit: RateLimit = field(default_factory=RateLimit)
    price: Price | None = None
    """What its tokens cost (`MODEL_PRICES`, the models file): for budgets in cost."""

    @property
    def bucket(self) -> str:
        """Its limiter key: no API key id has this form (`key-…`, `anonymous`)."""
        return f"model:{self.name}"


@dataclass(slots=True)
class Reservation:
    """What one admitted request holds until `Quotas.release`."""

    key_id: str
    limit: RateLimit
    completion_tokens: int
    """Completion tokens reserved (sequences × max_tokens)."""
    sequences: int
    headers: dict[str, str]
    priority: int = 0
    """The engine priority (0 unless the share prioritizes; see `quota.share`)."""
    local: bool = False
    released: bool = False
    model: ModelQuota | None = None
    """The model's limits it was charged to as well."""
    model_local: bool = False
    prompt_tokens: int = 0
    budget: BudgetHold | None = None
    """Its reservation against its key's budget, when the key has one."""

    @property
    def cost(self) -> int:
        """The tokens reserved: its prompt and every completion token it may produce."""
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Quotas:
    limiter: RateLimiter
    default: RateLimit = field(default_factory=RateLimit)
    overrides: dict[str, RateLimit] = field(default_factory=dict)
    share: SequenceShare = field(default_factory=SequenceShare)
    embedding_share: KeyShare = field(default_factory=KeyShare)
    """Each key's inputs being embedded (`/v1/embeddings`, rerank, score): their own share."""
    policies: Policies = no_policies
    """Managed keys' own limits, priority and budget, by key id."""
    budgets: BudgetKeeper | None = None
    """Where budgets are kept (Redis); None: no key has one (no managed keys)."""
    admin: RateLimit = field(default_factory=RateLimit)
    """Each key's calls of the admin endpoints (`ADMIN_REQUESTS_PER_MINUTE`, which the wiring
    gives; unlimited without it)."""

    def __post_init__(self) -> None:
        self.share.policies = self.policies
        self._giving_back: set[asyncio.Future[None]] = set()
        """Give-backs under way (held: a task the loop alone refers to may be collected)."""

    def limit_for(self, key_id: str) -> RateLimit:
        policy = self.policies(key_id)
        if policy is not None:
            default = self.default
            return RateLimit(
                policy.requests_per_minute or default.requests_per_minute,
                policy.tokens_per_minute or default.tokens_per_minute,
            )
        return self.overrides.get(key_id, self.default)

    async def enter(self, key_id: str, engine_work: bool = True, embeds: bool = False) -> None:
        """Count a request that has just arrived, before anything is done with its body.

        Raises `ConcurrencyLimitError` when it would start `engine_work` (or embed: `embeds`)
        and its key holds its whole share of it already, `BudgetExceededError` when it would
        and the key's budget was used up when Redis last said, and `RateLimitError` when the
        key's requests per minute are used up. Its tokens are reserved later (`reserve`, with
        `counted`)."""
        if embeds:
            self.embedding_share.check(key_id)
            self._check_budget(key_id)
        elif engine_work:
            self.share.check(key_id)
            self._check_budget(key_id)
        decision = await self.limiter.acquire(key_id, self.limit_for(key_id), 0)
        if not decision.allowed:
            _refuse(decision)

    async def enter_admin(self, key_id: str) -> None:
        """Count a call of the admin endpoints against its key's admin limit, which is its
        own (not the key's requests per minute). Raises `KeyRateLimitError` past it."""
        decision = await self.limiter.acquire(f"admin:{key_id}", self.admin, 0)
        if not decision.allowed:
            _refuse(decision, admin=True)

    def _check_budget(self, key_id: str) -> None:
        """Refuse a key whose budget is used up, from what this process last saw (no call to
        Redis): before its body is parsed, however large."""
        policy = self.policies(key_id)
        if self.budgets is None or policy is None or (budget := policy.budget) is None:
            return
        if self.budgets.spent(key_id, budget):
            # Refused as a reservation of nothing would be, with its message and headers.
            self.budgets.refuse(key_id)

    async def reserve(
        self,
        key_id: str,
        prompt_tokens: int,
        sequences: int,
        max_tokens: int,
        param: str = "n",
        priority: int = 0,
        counted: bool = False,
        model: ModelQuota | None = None,
        answered_tokens: int = 0,
        estimated: Callable[[], int] | None = None,
    ) -> Reservation:
        """Admit a request: take its sequences, count it (unless `enter` has: `counted`)
        and its possible tokens, against its key's limits and its `model`'s. `estimated`
        gives at most how many tokens its prompts no tokenizer here counts may take (asked
        only for a key with a budget: it reads the whole prompt), reserved against the
        budget alone (the rate limits charge them once the engine has counted them: a bound
        far above the count must not refuse a request that fits).

        Raises `ConcurrencyLimitError`/`InvalidRequestError` from the share,
        `KeyRateLimitError` (429) when a limit of the key is used up or the request could
        never fit it, and `RateLimitError` when the model's is."""
        limit = self.limit_for(key_id)
        completion_tokens = sequences * max_tokens + answered_tokens
        _check_fits(limit, prompt_tokens, completion_tokens)
        if model is not None:
            _check_fits(model.limit, prompt_tokens, completion_tokens, model.name)
        cost = prompt_tokens + completion_tokens
        priority = self.share.take(key_id, sequences, param, priority)
        charged: Decision | None = None
        decision: Decision | None = None
        try:
            if model is not None:
                # The model's first: a request it refuses costs the key nothing.
                charged = await self.limiter.acquire(model.bucket, model.limit, cost)
                if not charged.allowed:
                    _refuse(charged, model.name)
            decision = await self.limiter.acquire(key_id, limit, cost, requests=0 if counted else 1)
            if not decision.allowed:
                _refuse(decision)
            budget = await self._reserve_budget(
                key_id, prompt_tokens, completion_tokens, model, estimated
            )
        except BaseException:
            self.share.give_back(key_id, sequences)
            if model is not None and charged is not None and charged.allowed:
                await self.limiter.reconcile(model.bucket, model.limit, -cost, charged.local)
            if decision is not None and decision.allowed:
                await self.limiter.reconcile(key_id, limit, -cost, decision.local)
            raise
        headers = decision.headers
        if budget is not None:
            # Not into the decision's: an unlimited key's decisions share one (`window.ALLOW`).
            headers = {**headers, **budget.headers} if headers else budget.headers
        return Reservation(
            key_id,
            limit,
            completion_tokens,
            sequences,
            headers,
            priority,
            decision.local,
            model=model,
            model_local=charged is not None and charged.local,
            prompt_tokens=prompt_tokens,
            budget=budget,
        )

    async def _reserve_budget(
        self,
        key_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        model: ModelQuota | None,
        estimated: Callable[[], int] | None = None,
    ) -> BudgetHold | None:
        """Reserve the request's possible cost against its key's budget, if it has one."""
        policy = self.policies(key_id)
        if self.budgets is None or policy is None or policy.budget is None:
            return None
        budget = policy.budget
        if estimated is not None:
            prompt_tokens += estimated()
        amount = _spend(budget, model, prompt_tokens, completion_tokens)
        hold = self.budgets.reserve_here(key_id, budget, amount)
        return hold if hold is not None else await self.budgets.reserve(key_id, budget, amount)

    async def release(
        self, reservation: Reservation, completion_tokens: int, prompt_tokens: int
    ) -> None:
        """The request ended having produced `completion_tokens` from `prompt_tokens` (0
        when no engine took it up: a run refused or failed before it began, a client gone
        first): charge those instead of the reservation, and free its sequences. Only the
        first call counts, and a cancellation cannot stop it half way."""
        if reservation.released:
            return
        reservation.released = True
        self.share.give_back(reservation.key_id, reservation.sequences)
        model = reservation.model
        if (hold := reservation.budget) is not None and self.budgets is not None:
            self.budgets.settle(hold, _spend(hold.budget, model, prompt_tokens, completion_tokens))
        unused = completion_tokens + prompt_tokens - reservation.cost
        await self._give_back(reservation, unused)

    async def _give_back(self, reservation: Reservation, tokens: int) -> None:
        """Charge `tokens` more (negative: give them back) to the key's and the model's
        limits, to the end even if the caller is cancelled meanwhile."""
        if not tokens:
            return
        task = asyncio.ensure_future(self._reconcile(reservation, tokens))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        await asyncio.shield(task)

    async def _reconcile(self, reservation: Reservation, tokens: int) -> None:
        await self.limiter.reconcile(
            reservation.key_id, reservation.limit, tokens, local=reservation.local
        )
        if (model := reservation.model) is not None:
            await self.limiter.reconcile(
                model.bucket, model.limit, tokens, local=reservation.model_local
            )

    async def admit(
        self,
        key_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        model: ModelQuota | None = None,
    ) -> dict[str, str]:
        """Count a request whose whole cost is known (a cached answer) and that runs no
        sequence; return the rate-limit (and budget) headers."""
        reservation = await self.reserve(
            key_id, prompt_tokens, 0, 0, model=model, answered_tokens=completion_tokens
        )
        return reservation.headers

    def runs_elsewhere(self, reservation: Reservation) -> None:
        """The request starts no engine work of its own (a cache hit, or it follows an
        identical request's run): its sequences go back to the key's share at once."""
        self.share.give_back(reservation.key_id, reservation.sequences)
        reservation.sequences = 0

    def runs_itself(self, reservation: Reservation, sequences: int) -> None:
        """The request it followed was lost and it generates after all: it holds its
        sequences again (unchecked: it was admitted, and may have begun to answer)."""
        self.share.hold(reservation.key_id, sequences)
        reservation.sequences = sequences


def _spend(
    budget: KeyBudget, model: ModelQuota | None, prompt_tokens: int, completion_tokens: int
) -> int:
    """What so many tokens take from `budget`: the tokens, or their cost at the model's price
    (nothing for a model without one)."""
    if budget.unit == "tokens":
        return prompt_tokens + completion_tokens
    price = None if model is None else model.price
    return (price or _FREE).cost(prompt_tokens, completion_tokens)


_FREE = Price()


def _refuse(decision: Decision, model: str | None = None, admin: bool = False) -> NoReturn:
    """The 429 of a refusal by the key's limits, by its `admin` limit, or by `model`'s."""
    which = decision.limit or "requests"
    RATE_LIMITED.labels(limit="admin" if admin else which).inc()
    # The limit that refused: this replica's share of it while Redis is down.
    per_minute = decision.headers.get(f"x-ratelimit-limit-{which}", "?")
    retry = decision.headers.get("retry-after", "1")
    if model is not None:
        raise RateLimitError(
            f"Rate limit reached for {which} per minute on the model {model} (limit "
            f"{per_minute}, across every key). Retry after {retry} s.",
            headers={"retry-after": retry},
        )
    if admin:
        which = "admin calls"
    raise KeyRateLimitError(
        f"Rate limit reached for {which} per minute (limit {per_minute}). Retry after {retry} s.",
        headers=decision.headers,
    )


def _check_fits(
    limit: RateLimit, prompt_tokens: int, completion_tokens: int, model: str | None = None
) -> None:
    """A request whose possible cost exceeds the whole tokens-per-minute limit never fits:
    refuse it at once, saying what to lower, rather than with a Retry-After that lies."""
    tpm = limit.tokens_per_minute
    cost = prompt_tokens + completion_tokens
    if tpm is None or cost <= tpm:
        return
    RATE_LIMITED.labels(limit="tokens").inc()
    whose = "this API key's limit" if model is None else f"the model {model}'s limit"
    error = KeyRateLimitError if model is None else RateLimitError
    raise error(
        f"Request too large: it may use {cost} tokens ({prompt_tokens} prompt + up to "
        f"{completion_tokens} completion), more than {whose} of {tpm} tokens "
        "per minute. Lower max_tokens or n, or shorten the prompt.",
        param="max_tokens" if prompt_tokens <= tpm else None,
        headers={"x-ratelimit-limit-tokens": str(tpm)},
    )
