"""`/admin/usage` and `/v1/me/usage` over the real app (a fake engine, managed keys) and a real
Redis: what a call costs its key, which dates a query may give, and CSV a spreadsheet reads
as text."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis

from sluicegate.tenancy.ledger import day_set, hash_key
from sluicegate.tenancy.usage import MAX_DAYS, MAX_OWN_DAYS
from tests.support.fakes import serve_in_thread
from tests.support.redis_server import shared_redis_url
from tests.support.replicas import ADMIN, auth, create_key, replica

MINE, ALL = "/v1/me/usage", "/admin/usage"


@pytest.fixture
def url(prefix: str) -> Iterator[str]:
    with serve_in_thread(replica(prefix)) as base:
        yield base


def today() -> datetime:
    return datetime.now(UTC)


def days_ago(days: int) -> str:
    return (today() - timedelta(days=days)).date().isoformat()


def test_a_keys_own_usage_is_counted_against_its_requests_per_minute(url: str) -> None:
    key = create_key(url, rpm=2)["key"]
    statuses = [httpx.get(f"{url}{MINE}", headers=auth(key)).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    refused = httpx.get(f"{url}{MINE}", headers=auth(key))
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    # Its inference requests share that count.
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
        headers=auth(key),
    )
    assert chat.status_code == 429


@pytest.mark.parametrize("path", [MINE, ALL])
@pytest.mark.parametrize(
    "params",
    [
        {"start": "9999-12-31", "end": "9999-12-31"},
        {"start": "9999-12-31"},
        {"start": "tomorrow"},
    ],
)
def test_a_start_after_today_is_a_400_not_a_500(
    url: str, path: str, params: dict[str, str]
) -> None:
    if params["start"] == "tomorrow":
        # Computed as the test runs, not when it is collected (a run across midnight made
        # "tomorrow" today), and a day further on, should midnight fall during the request.
        params = {"start": (today() + timedelta(days=2)).date().isoformat()}
    key = create_key(url)["key"] if path == MINE else ADMIN
    answer = httpx.get(f"{url}{path}", params=params, headers=auth(key))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "start" and "after today" in error["message"]


@pytest.mark.parametrize("path", [MINE, ALL])
def test_an_end_after_today_reads_up_to_today(url: str, path: str) -> None:
    key = create_key(url)["key"] if path == MINE else ADMIN
    for params in ({"end": "9999-12-31"}, {"start": days_ago(30), "end": "9999-12-31"}):
        answer = httpx.get(f"{url}{path}", params=params, headers=auth(key))
        assert answer.status_code == 200, answer.text
        assert answer.json()["data"] == []
    oldest = httpx.get(
        f"{url}{path}", params={"start": "0001-01-01", "end": "0001-01-02"}, headers=auth(key)
    )
    assert oldest.status_code == 200, oldest.text


def test_a_keys_own_usage_covers_at_most_a_quarter(url: str) -> None:
    key = create_key(url)["key"]
    within = {"start": days_ago(MAX_OWN_DAYS - 1)}
    assert httpx.get(f"{url}{MINE}", params=within, headers=auth(key)).status_code == 200
    longer = {"start": days_ago(MAX_OWN_DAYS)}
    refused = httpx.get(f"{url}{MINE}", params=longer, headers=auth(key))
    assert refused.status_code == 400, refused.text
    assert f"at most {MAX_OWN_DAYS} days" in refused.json()["error"]["message"]
    # Every key's usage, for an admin, over a longer range.
    year = {"start": days_ago(MAX_DAYS - 1)}
    assert httpx.get(f"{url}{ALL}", params=year, headers=auth(ADMIN)).status_code == 200


FORMULAS = ['=HYPERLINK("http://x","y")', "+1+2", "-3+4", "@SUM(A1)", "\tx", "\r=1"]


def test_csv_cells_a_spreadsheet_would_run_are_written_as_text(url: str, prefix: str) -> None:
    day = today().date().isoformat()
    client = redis.Redis.from_url(shared_redis_url())
    try:
        for n, model in enumerate(FORMULAS):
            key_id = f"@key{n}" if n % 2 else f"key-{n:012d}"
            client.sadd(day_set(prefix, day), key_id)
            client.hset(hash_key(prefix, day, key_id), f"requests:{model}", 3)
    finally:
        client.close()
    answer = httpx.get(
        f"{url}{ALL}", params={"start": day}, headers={**auth(ADMIN), "accept": "text/csv"}
    )
    assert answer.status_code == 200, answer.text
    rows = list(csv.DictReader(io.StringIO(answer.text, newline="")))
    assert sorted(row["model"] for row in rows) == sorted("'" + m for m in FORMULAS)
    assert {row["key_id"] for row in rows if row["key_id"].startswith("'")} == {
        "'@key1",
        "'@key3",
        "'@key5",
    }
    assert all(row["requests"] == "3" for row in rows)
    # Every text cell quoted, numbers not.
    assert answer.text.splitlines()[0].startswith('"period","key_id","model",')
    assert ",3," in answer.text
