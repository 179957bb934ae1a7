"""The `key` label of per-key metrics, bounded: a key's public id for the first `cap` keys a
process sees, `other` for every key after them, so that thousands of keys cannot make
thousands of series. Labelled children are looked up once per key."""

from __future__ import annotations

from prometheus_client import Counter

from sluicegate.observability.metrics import BUDGET_REFUSALS, BUDGET_USED, KEY_REQUESTS, KEY_TOKENS

OTHER = "other"


class KeyLabels:
    def __init__(self, cap: int = 100) -> None:
        self._cap = cap
        self._labels: dict[str, str] = {}
        self._named = 0
        self._requests: dict[str, Counter] = {}
        self._tokens: dict[tuple[str, str], Counter] = {}

    def label(self, key_id: str) -> str:
        found = self._labels.get(key_id)
        if found is None:
            found = key_id if self._named < self._cap else OTHER
            if found != OTHER:
                self._named += 1
                self._labels[key_id] = found
            elif len(self._labels) < 10 * self._cap:  # the map itself stays bounded too
                self._labels[key_id] = found
        return found

    def settled(self, key_id: str, input_tokens: int, output_tokens: int) -> None:
        label = self.label(key_id)
        counter = self._requests.get(label)
        if counter is None:
            counter = self._requests[label] = KEY_REQUESTS.labels(label)
        counter.inc()
        for kind, amount in (("input", input_tokens), ("output", output_tokens)):
            if amount:
                tokens = self._tokens.get((label, kind))
                if tokens is None:
                    tokens = self._tokens[(label, kind)] = KEY_TOKENS.labels(label, kind)
                tokens.inc(amount)

    def refused_for_budget(self, key_id: str) -> None:
        BUDGET_REFUSALS.labels(self.label(key_id)).inc()

    def budget_used(self, key_id: str, ratio: float) -> None:
        label = self.label(key_id)
        if label != OTHER:
            BUDGET_USED.labels(label).set(ratio)
