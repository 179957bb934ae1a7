"""The usage ledger over two replicas of the real app (a fake engine each) and a real Redis:
totals that match the responses, JSON and CSV, a key's own usage, and a Redis that dies and
comes back, or stays away past the give-up time."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, serve_in_thread
from tests.support.metrics import scrape, value
from tests.support.redis_server import running_redis
from tests.support.replicas import ADMIN, auth, chat, create_key, known_on, replica, two_replicas

PRICES = {FAKE_MODEL: {"input": 1000.0, "output": 2000.0}}


@pytest.fixture
def replicas(prefix: str) -> Iterator[tuple[str, str]]:
    with two_replicas(prefix, model_prices=PRICES) as urls:
        yield urls


def _streamed_usage(url: str, key: str) -> dict[str, int]:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=10
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return dict(json.loads(lines[-1][6:])["usage"])


def _usage(url: str, key: str, **params: Any) -> dict[str, Any]:
    """What the ledger says, once it has every request (a write lands within a flush)."""
    return httpx.get(f"{url}/admin/usage", params=params, headers=auth(key), timeout=10).json()


def _settled(url: str, key_id: str, requests: int) -> dict[str, Any]:
    while True:
        answer = _usage(url, ADMIN, key_id=key_id)
        if answer["totals"]["requests"] >= requests:
            return answer
        time.sleep(0.05)  # pytest's timeout bounds a ledger that never catches up


def test_the_ledger_holds_what_every_response_said_it_used(replicas: tuple[str, str]) -> None:
    a, b = replicas
    created = create_key(a, name="ledgered")
    key, key_id = created["key"], created["id"]
    known_on(b, key)
    usages = [chat(url, key).json()["usage"] for url in (a, b, a)]
    usages += [_streamed_usage(url, key) for url in (a, b)]
    assert chat(a, key, max_tokens=0).status_code == 400  # an error, counted as one
    answer = _settled(a, key_id, len(usages) + 1)
    totals = answer["totals"]
    assert totals["requests"] == len(usages) + 1 and totals["errors"] == 1
    assert totals["input_tokens"] == sum(u["prompt_tokens"] for u in usages)
    assert totals["output_tokens"] == sum(u["completion_tokens"] for u in usages)
    assert totals["cached_input_tokens"] == 0
    # 1000 and 2000 per million tokens.
    expected = (totals["input_tokens"] * 1000 + totals["output_tokens"] * 2000) / 1e6
    assert totals["cost"] == pytest.approx(expected)
    rows = answer["data"]
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert {(r["period"], r["key_id"]) for r in rows} == {(day, key_id)}
    assert sum(r["requests"] for r in rows) == totals["requests"]
    # The key's own view, by month, and as CSV.
    mine = httpx.get(f"{b}/v1/me/usage", params={"group_by": "month"}, headers=auth(key)).json()
    assert mine["totals"] == totals and {r["period"] for r in mine["data"]} == {day[:7]}
    text = httpx.get(
        f"{a}/admin/usage",
        params={"key_id": key_id},
        headers={**auth(ADMIN), "accept": "text/csv"},
    )
    assert text.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(text.text)))
    assert sum(int(r["output_tokens"]) for r in parsed) == totals["output_tokens"]


def test_a_key_sees_only_its_own_usage_and_queries_are_checked(
    replicas: tuple[str, str],
) -> None:
    a, _ = replicas
    first, second = create_key(a), create_key(a)
    assert chat(a, first["key"]).status_code == 200
    _settled(a, first["id"], 1)
    theirs = httpx.get(f"{a}/v1/me/usage", headers=auth(second["key"])).json()
    assert theirs["data"] == [] and theirs["totals"]["requests"] == 0
    everyone = _usage(a, ADMIN)
    assert first["id"] in {r["key_id"] for r in everyone["data"]}
    for params in ({"start": "2026-02-01", "end": "2026-01-01"}, {"start": "2020-01-01"}):
        assert httpx.get(f"{a}/admin/usage", params=params, headers=auth(ADMIN)).status_code == 400
    other_model = _usage(a, ADMIN, key_id=first["id"], model="nothing")
    assert other_model["data"] == []


def test_redis_killed_and_restarted_loses_no_usage(prefix: str, tmp_path: Path) -> None:
    with running_redis(tmp_path, persist=True) as server:
        app = replica(prefix, server.url, engine=FakeEngine())
        with serve_in_thread(app) as url:
            created = create_key(url)
            key, key_id = created["key"], created["id"]
            before = chat(url, key).json()["usage"]
            _settled(url, key_id, 1)
            lost_before = _lost(url)
            server.kill()
            during = [chat(url, key) for _ in range(3)]
            assert [r.status_code for r in during] == [200, 200, 200]
            server.start()
            answer = _settled(url, key_id, 4)
            assert answer["totals"]["requests"] == 4
            produced = before["completion_tokens"] + sum(
                r.json()["usage"]["completion_tokens"] for r in during
            )
            assert answer["totals"]["output_tokens"] == produced
            assert _lost(url) == lost_before


def test_usage_that_cannot_be_written_in_time_is_counted_as_lost(
    prefix: str, tmp_path: Path
) -> None:
    with running_redis(tmp_path) as server:
        app = replica(prefix, server.url, usage_give_up_seconds=0.3)
        with serve_in_thread(app) as url:
            key = create_key(url)["key"]
            lost_before = _lost(url)
            server.kill()
            tokens = sum(chat(url, key).json()["usage"]["completion_tokens"] for _ in range(2))
            while _lost(url) < lost_before + 2:
                time.sleep(0.05)  # dropped once the give-up time has passed
            assert _lost(url, "output_tokens") >= tokens


def _lost(url: str, measure: str = "requests") -> float:
    return value(scrape(url, ADMIN), "sluicegate_usage_lost_total", measure=measure)
