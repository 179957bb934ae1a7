"""One API key's share of the engine: the sequences (prompts × n) it has in flight.

vLLM runs at most MAX_NUM_SEQS sequences at once and queues the rest. Without a bound, one
key's large requests (many prompts, large `n`) fill every slot and everyone else waits
behind them. `per_key` bounds each key's sequences in flight (429
`concurrency_limit_exceeded`); with `prioritize` (vLLM's priority scheduling) a request is
also queued behind those of keys with fewer sequences in flight: its engine priority is the
number its key already has running (vLLM runs lower values first).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.errors import ConcurrencyLimitError, InvalidRequestError
from sluicegate.observability.metrics import RATE_LIMITED

RETRY_AFTER_S = "1"


@dataclass
class SequenceShare:
    per_key: int | None = None
    """Sequences one key may have in flight; None: no bound (no API keys configured)."""
    prioritize: bool = False
    _in_flight: dict[str, int] = field(default_factory=dict)

    def take(self, key_id: str, sequences: int, param: str) -> int:
        """Count a request's sequences in flight; return its engine priority.

        Raises `ConcurrencyLimitError` while the key holds its share, and
        `InvalidRequestError` (naming `param`) for a request larger than the share."""
        if sequences <= 0:
            return 0
        held = self._in_flight.get(key_id, 0)
        if self.per_key is not None:
            if sequences > self.per_key:
                raise InvalidRequestError(
                    f"This request would start {sequences} sequences (prompts × n); an API key "
                    f"may have at most {self.per_key} in flight.",
                    param=param,
                )
            if held + sequences > self.per_key:
                RATE_LIMITED.labels(limit="sequences").inc()
                raise ConcurrencyLimitError(
                    f"This API key has {held} sequences in flight; {sequences} more would pass "
                    f"its share of {self.per_key}. Retry when some have finished.",
                    headers={"retry-after": RETRY_AFTER_S},
                )
        self._in_flight[key_id] = held + sequences
        return held if self.prioritize else 0

    def hold(self, key_id: str, sequences: int) -> None:
        """Count sequences in flight without checking the share."""
        if sequences > 0:
            self._in_flight[key_id] = self._in_flight.get(key_id, 0) + sequences

    def give_back(self, key_id: str, sequences: int) -> None:
        left = self._in_flight.get(key_id, 0) - sequences
        if left > 0:
            self._in_flight[key_id] = left
        else:
            self._in_flight.pop(key_id, None)

    def in_flight(self, key_id: str) -> int:
        return self._in_flight.get(key_id, 0)
