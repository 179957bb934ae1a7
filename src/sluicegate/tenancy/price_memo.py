"""Each model's price as the model registry last gave it, remembered for a while: what the
usage ledger asks at each request (`wiring.open_ledger`), the registry once per model per
`hit_life`.

The memo is bounded (`max_entries`, least recently used first out), and what it remembers
lives a while only: a model without a price, or not (yet) known to the registry (an adapter a
pool lists later, one loaded at run time), is asked again after `miss_life`, so a price that
comes later is counted from then on; a price found is asked again after `hit_life`, so a
name that comes to mean another model (an adapter loaded again on another base) takes its
price.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluicegate.lru import BoundedLRU
from sluicegate.prices import Price

MAX_ENTRIES = 1024
HIT_LIFE = 60.0
MISS_LIFE = 5.0


class PriceMemo:
    def __init__(
        self,
        price_of: Callable[[str], Price | None],
        max_entries: int = MAX_ENTRIES,
        hit_life: float = HIT_LIFE,
        miss_life: float = MISS_LIFE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._price_of = price_of
        self._entries: BoundedLRU[str, tuple[Price | None, float]] = BoundedLRU(max_entries)
        self._hit_life = hit_life
        self._miss_life = miss_life
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def price(self, model: str) -> Price | None:
        """What the model `model`'s tokens cost, if it has a price."""
        now = self._clock()
        found = self._entries.get(model)
        if found is not None and now < found[1]:
            return found[0]
        price = self._price_of(model)
        life = self._miss_life if price is None else self._hit_life
        self._entries.put(model, (price, now + life))
        return price
