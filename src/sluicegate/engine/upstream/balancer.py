"""Which upstream takes a request.

Least outstanding requests with power-of-two choices: two upstreams drawn at random
(weighted), the one with fewer requests in flight per unit of weight wins. It keeps load even
without the herding of always picking the least loaded.

With prefix affinity, the start of the prompt is hashed onto a ring of upstreams (each placed
in proportion to its weight): prompts that start alike go to the same upstream, whose prefix
cache then holds their shared start. Bounded load (consistent hashing with bounded loads,
Mirrokni et al.): an upstream takes an affine request only while its in-flight count stays
within `load_factor` of its share of all requests in flight; else the next on the ring does.

A request for an adapter prefers the upstreams that list it (`prefer`), under the same bound:
while one of them is within it, the pick is among them; past it, among all.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import time
from collections.abc import Collection, Sequence

from sluicegate.engine.upstream.config import AffinityConfig
from sluicegate.engine.upstream.server import Upstream
from sluicegate.errors import EngineUnavailableError, GatewayError
from sluicegate.observability import metrics

_POINTS_PER_WEIGHT = 64
_DEFAULT_LOAD_FACTOR = 2.0
"""The bound on preferred upstreams when prefix affinity (and its `load_factor`) is off."""


class Balancer:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        affinity: AffinityConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.upstreams = list(upstreams)
        self._affinity = affinity
        self._rng = rng or random.Random()
        self._ring: list[tuple[int, int]] = []
        if affinity is not None:
            lowest = min(u.weight for u in self.upstreams)
            for index, upstream in enumerate(self.upstreams):
                points = max(1, round(_POINTS_PER_WEIGHT * upstream.weight / lowest))
                for point in range(points):
                    self._ring.append((_hash(f"{upstream.url}#{point}"), index))
            self._ring.sort()

    def pick(
        self,
        prefix: str | None = None,
        tried: Collection[int] = (),
        prefer: Collection[int] | None = None,
    ) -> int | None:
        """The index of the upstream to try, or None when none is available. `tried`: the
        upstreams this request has already failed on (used only when nothing else is left).
        `prefer`: upstreams to pick among while one of them is within its load bound."""
        now = time.monotonic()
        candidates = [
            i for i, u in enumerate(self.upstreams) if i not in tried and u.available(now)
        ]
        if not candidates:
            candidates = [i for i, u in enumerate(self.upstreams) if u.available(now)]
        if not candidates:
            return None
        if prefer:
            within = [i for i in candidates if i in prefer and self._within_bound(i, candidates)]
            if within:
                candidates = within
        if self._affinity is not None and prefix:
            chosen, spilled = self._affine(prefix[: self._affinity.chars], set(candidates))
            if chosen is None:  # not reached: the least loaded is always within a bound >= 1
                chosen = self._two_choices(candidates)
            result = "spilled" if spilled else "home"
            metrics.UPSTREAM_AFFINITY_PICKS.labels(self.upstreams[chosen].label, result).inc()
            return chosen
        return self._two_choices(candidates)

    def refusal(self, last: GatewayError | None, probe_interval: float) -> GatewayError:
        """What a request gets when no upstream can take it: the error of its last try, if
        any (it says why better: its breaker may have opened, or its Retry-After taken it
        out, with nothing else left), else a 503. Either says when to come back: its
        `Retry-After` is the time left until the first upstream may be tried again (an
        unhealthy one's at the next health probe, every `probe_interval`), rounded up."""
        error = last or EngineUnavailableError("No upstream is available.")
        now = time.monotonic()
        waits = [probe_interval if (w := u.wait(now)) is None else w for u in self.upstreams]
        seconds = max(1, math.ceil(min(waits, default=probe_interval)))
        error.headers.setdefault("retry-after", str(seconds))
        return error

    def _two_choices(self, candidates: list[int]) -> int:
        if len(candidates) == 1:
            return candidates[0]
        weights = [self.upstreams[i].weight for i in candidates]
        first = self._rng.choices(candidates, weights)[0]
        rest = [i for i in candidates if i != first]
        second = self._rng.choices(rest, [self.upstreams[i].weight for i in rest])[0]
        return min((first, second), key=self._load)

    def _within_bound(self, index: int, candidates: list[int]) -> bool:
        """Whether one more request keeps the upstream within its bounded share of all the
        requests in flight on `candidates` (the bound prefix affinity uses)."""
        factor = self._affinity.load_factor if self._affinity else _DEFAULT_LOAD_FACTOR
        total_weight = sum(self.upstreams[i].weight for i in candidates)
        in_flight = sum(self.upstreams[i].in_flight for i in candidates) + 1
        upstream = self.upstreams[index]
        share = in_flight * upstream.weight / total_weight
        return upstream.in_flight + 1 <= math.ceil(factor * share)

    def _load(self, index: int) -> float:
        upstream = self.upstreams[index]
        return upstream.in_flight / upstream.weight

    def _affine(self, prefix: str, candidates: set[int]) -> tuple[int | None, bool]:
        """The first upstream on the ring from the prefix's hash that is available and within
        its bound, and whether it is not the prefix's home (the first on the ring): the
        request spilled over."""
        assert self._affinity is not None
        total_weight = sum(self.upstreams[i].weight for i in candidates)
        in_flight = sum(self.upstreams[i].in_flight for i in candidates) + 1
        start = bisect.bisect(self._ring, (_hash(prefix), -1))
        home = self._ring[start % len(self._ring)][1]
        seen: set[int] = set()
        for step in range(len(self._ring)):
            _, index = self._ring[(start + step) % len(self._ring)]
            if index in seen or index not in candidates:
                continue
            seen.add(index)
            upstream = self.upstreams[index]
            share = in_flight * upstream.weight / total_weight
            if upstream.in_flight + 1 <= math.ceil(self._affinity.load_factor * share):
                return index, index != home
            if len(seen) == len(candidates):
                break
        return None, True


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
