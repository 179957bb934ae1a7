"""`PriceMemo`: the usage ledger's prices, remembered a while and within a bound."""

from __future__ import annotations

from sluicegate.prices import Price
from sluicegate.tenancy.price_memo import PriceMemo

PRICE = Price(1.0, 2.0)


def test_a_model_without_a_price_gets_the_one_it_is_given_later() -> None:
    now = [0.0]
    prices: dict[str, Price] = {}
    asked: list[str] = []

    def price_of(model: str) -> Price | None:
        asked.append(model)
        return prices.get(model)

    memo = PriceMemo(price_of, miss_life=5.0, hit_life=60.0, clock=lambda: now[0])
    assert memo.price("adapter") is None
    prices["adapter"] = PRICE  # an adapter a pool lists later, at its base model's price
    now[0] = 4.0
    assert memo.price("adapter") is None and asked == ["adapter"]  # a miss, remembered a while
    now[0] = 5.0
    assert memo.price("adapter") == PRICE
    prices["adapter"] = Price(3.0, 3.0)  # loaded again, on another base
    now[0] = 64.0
    assert memo.price("adapter") == PRICE and len(asked) == 2  # a price, remembered longer
    now[0] = 65.0
    assert memo.price("adapter") == Price(3.0, 3.0)


def test_the_memo_is_bounded() -> None:
    memo = PriceMemo(lambda model: PRICE, max_entries=8)
    for i in range(100):
        assert memo.price(f"model-{i}") == PRICE
    assert len(memo) == 8
