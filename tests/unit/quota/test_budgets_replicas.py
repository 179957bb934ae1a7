"""Budgets over two replicas of the real app (a fake engine each) and a real Redis: a token
budget that holds exactly across them, a large one charged in memory far from its end, and a
cost budget at the model's price."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.fakes import FAKE_MODEL
from tests.support.redis_server import shared_redis_url
from tests.support.replicas import chat, create_key, known_on, two_replicas

PRICES = {FAKE_MODEL: {"input": 1000.0, "output": 2000.0}}


@pytest.fixture
def replicas(prefix: str) -> Iterator[tuple[str, str]]:
    with two_replicas(prefix, model_prices=PRICES) as urls:
        yield urls


def _spend(
    replicas: tuple[str, str], key: str, budget: int, tries: int, refusals_wanted: int = 0
) -> tuple[int, int, list[httpx.Response]]:
    """Requests of at most 5 tokens, each replica in turn, for `tries` requests or until
    `refusals_wanted` are refused: the tokens served, the largest reservation admitted, and
    the refusals. Every answer admitted says it leaves no more than the budget."""
    served, largest, refusals = 0, 0, []
    for i in range(tries):
        answer = chat(replicas[i % 2], key, max_tokens=5)
        if answer.status_code == 200:
            usage = answer.json()["usage"]
            served += usage["total_tokens"]
            largest = max(largest, usage["prompt_tokens"] + 5)
            assert int(answer.headers["x-sluicegate-budget-remaining"]) <= budget
            continue
        refusals.append(answer)
        if len(refusals) == refusals_wanted:
            break
    return served, largest, refusals


def test_a_token_budget_holds_across_both_replicas(replicas: tuple[str, str]) -> None:
    a, b = replicas
    budget = 60
    created = create_key(a, budget={"tokens": budget, "period": "day"})
    key = created["key"]
    known_on(b, key)
    served, largest, refusals = _spend(replicas, key, budget, tries=40)
    assert refusals, "the budget never refused"
    assert served <= budget
    assert budget - served <= largest  # within one request's reservation of the budget
    refused = refusals[-1]
    error = refused.json()["error"]
    assert refused.status_code == 429 and error["code"] == "insufficient_quota"
    assert error["type"] == "insufficient_quota" and "resets at" in error["message"]
    assert refused.headers["x-sluicegate-budget-reset"].endswith("T00:00:00Z")


def test_a_large_budget_is_charged_in_memory_then_exactly_near_its_end(
    replicas: tuple[str, str], prefix: str
) -> None:
    """Far from the end each replica charges in memory and adds it in Redis every sync; near
    the end every reservation is made in Redis: the budget still holds exactly."""
    a, b = replicas
    budget = 1500
    created = create_key(a, budget={"tokens": budget, "period": "day"})
    key = created["key"]
    known_on(b, key)
    served, largest, refusals = _spend(replicas, key, budget, tries=400, refusals_wanted=4)
    assert all(r.json()["error"]["code"] == "insufficient_quota" for r in refusals)
    assert refusals and budget - largest <= served <= budget
    day = time.strftime("%Y-%m-%d", time.gmtime())
    counter = f"{prefix}:budget:{{{created['id']}}}:{day}:tokens"
    client = redis.Redis.from_url(shared_redis_url())
    while int(client.get(counter) or 0) != served:
        time.sleep(0.02)  # the replicas' syncs land (pytest's timeout bounds one that never does)


def test_a_cost_budget_is_charged_at_the_models_price(replicas: tuple[str, str]) -> None:
    a, _ = replicas
    # 1000 per million input tokens, 2000 per million output: a request costs a few cents.
    created = create_key(a, budget={"cost": 0.05, "period": "month"})
    statuses = [chat(a, created["key"], max_tokens=3).status_code for _ in range(10)]
    assert 200 in statuses and statuses[-1] == 429
    assert statuses == sorted(statuses)  # served until refused, then refused
    answer = chat(a, created["key"], max_tokens=3)
    assert "x-sluicegate-budget-remaining" in answer.headers
    assert 0 <= float(answer.headers["x-sluicegate-budget-remaining"]) < 0.05
