"""One API key's share of the engine: the sequences (prompts × n) it has in flight, and
of the embedding engine: the inputs it has being embedded.

vLLM runs at most MAX_NUM_SEQS sequences at once and queues the rest. Without a bound, one
key's large requests (many prompts, large `n`) fill every slot and everyone else waits
behind them. `per_key` bounds each key's sequences in flight (429
`concurrency_limit_exceeded`).

With `prioritize` (vLLM's priority scheduling, which runs lower values first) this is also
where a request's engine priority is made, in three ranks:

1. its key's priority (`priorities`, KEY_PRIORITIES): every request of a key with a lower one
   is scheduled before any of a key with a higher one;
2. within a rank, the priority the request asks for (vLLM's `priority` field) plus the
   sequences its key already has in flight, so a busy key's requests queue behind those of
   quieter keys. With API keys a request may only ask to go later (`priority` >= 0), never
   ahead of its key's rank; without them (one tenant, as behind `vllm serve`) any value goes;
3. ties go by arrival (vLLM's own order).

Without `prioritize` the engine runs first come, first served, and a request asking for a
priority other than 0 gets a 400 naming it, as from vLLM's server.

Embeddings (`/v1/embeddings`, `/v1/rerank`, `/v1/score`) have a share of their own,
`KeyShare` counting inputs (MAX_EMBEDDING_INPUTS_PER_KEY): one key's backlog of embeddings
neither holds another key's nor the chat share of its own key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from sluicegate.counters import LocalTally, Tally
from sluicegate.errors import ConcurrencyLimitError, InvalidRequestError
from sluicegate.keys import KeyPolicy
from sluicegate.observability.metrics import RATE_LIMITED

RETRY_AFTER_S = "1"
_SEQUENCES = "seq:"
"""A key's sequences in the tally (which admission shares, `http.admission`)."""
EMBEDDING_INPUTS = "emb:"
"""A key's inputs being embedded, in the tally."""
RANK_SPAN = 1 << 40
"""Engine priorities of one key rank lie within this of each other (a request's own
`priority` is at most int32, its sequences in flight far fewer)."""


@dataclass
class KeyShare:
    """What each API key has in flight of one kind of work, `per_key` at most."""

    per_key: int | None = None
    """What one key may have in flight; None: no bound (no API keys configured)."""
    tally: Tally = field(default_factory=LocalTally)
    """Where it is counted: shared by the workers when there are several
    (`worker.Worker.tally`), so that a key's share holds for the whole gateway."""
    prefix: str = EMBEDDING_INPUTS
    """Its keys in the tally."""
    unit: str = "inputs being embedded"
    """What is counted, as the 429 says it; `limit` is its label in the metrics."""
    limit: str = "embedding_inputs"

    def take_some(self, key_id: str, count: int, param: str) -> int:
        """Count `count` in flight for the key; return what it held before. Raises
        `ConcurrencyLimitError` while the key holds its share, and `InvalidRequestError`
        (naming `param`) for a request larger than the share."""
        if count <= 0:
            return 0
        if self.per_key is not None and count > self.per_key:
            raise InvalidRequestError(
                f"This request has {count} {self.unit}; an API key may have at most "
                f"{self.per_key} in flight.",
                param=param,
            )
        taken, held = self.tally.take(self.prefix + key_id, count, self.per_key)
        if not taken:
            self._refuse(held, str(count))
        return held

    def check(self, key_id: str) -> None:
        """Raise `ConcurrencyLimitError` if the key holds its whole share already: then no
        request of it could be taken, whatever its size (nothing is counted)."""
        if self.per_key is not None and (held := self.in_flight(key_id)) >= self.per_key:
            self._refuse(held, "any")

    def hold(self, key_id: str, count: int) -> None:
        """Count in flight without checking the share."""
        if count > 0:
            self.tally.take(self.prefix + key_id, count, None)

    def give_back(self, key_id: str, count: int) -> None:
        if count > 0:
            self.tally.give_back(self.prefix + key_id, count)

    def in_flight(self, key_id: str) -> int:
        return self.tally.count(self.prefix + key_id)

    def _refuse(self, held: int, more: str) -> NoReturn:
        RATE_LIMITED.labels(limit=self.limit).inc()
        raise ConcurrencyLimitError(
            f"This API key has {held} {self.unit} in flight; {more} more would pass its share "
            f"of {self.per_key}. Retry when some have finished.",
            headers={"retry-after": RETRY_AFTER_S},
        )


@dataclass
class SequenceShare(KeyShare):
    prefix: str = _SEQUENCES
    unit: str = "sequences"
    limit: str = "sequences"
    prioritize: bool = False
    priorities: dict[str, int] = field(default_factory=dict)
    """Each API key's rank (KEY_PRIORITIES), by key id; 0 for the others."""
    policies: Callable[[str], KeyPolicy | None] = lambda key_id: None
    """Managed keys' settings (their own `priority` ranks them), by key id."""
    keyed: bool = False
    """Whether requests come with API keys (then one may not ask to go ahead of its key)."""

    def take(self, key_id: str, sequences: int, param: str, requested: int = 0) -> int:
        """Count a request's sequences in flight; return its engine priority, given the
        `priority` it asked for.

        Raises `ConcurrencyLimitError` while the key holds its share, and
        `InvalidRequestError` (naming `param`) for a request larger than the share, or
        (naming `priority`) for a priority it may not ask for."""
        self._check_requested(requested)
        if self.per_key is not None and sequences > self.per_key:
            raise InvalidRequestError(
                f"This request would start {sequences} sequences (prompts × n); an API key "
                f"may have at most {self.per_key} in flight.",
                param=param,
            )
        held = self.take_some(key_id, sequences, param)
        if not self.prioritize or sequences <= 0:
            return 0
        return self.rank(key_id) * RANK_SPAN + requested + held

    def rank(self, key_id: str) -> int:
        policy = self.policies(key_id)
        if policy is not None and policy.priority is not None:
            return policy.priority
        return self.priorities.get(key_id, 0)

    def _check_requested(self, requested: int) -> None:
        if requested and not self.prioritize:
            raise InvalidRequestError(
                "priority is only used with priority scheduling, and this server schedules "
                "first come, first served: leave it out or at 0.",
                param="priority",
            )
        if requested < 0 and self.keyed:
            raise InvalidRequestError(
                "priority must be at least 0: a request may ask to be scheduled later than its "
                "API key's others, never ahead of them.",
                param="priority",
            )
