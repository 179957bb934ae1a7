"""Managed keys, the usage ledger and budgets on two real gateway replicas (`sluicegate serve`
processes in upstream mode, over the fault-injecting upstream) sharing a real Redis of the
module's own, which is killed and started again.

No engine starts: the upstream streams its canned words with a delay per chunk, so a stream
can be cut half-way and what it produced is known from the gateway's side only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream
from tests.support.gateway import GatewayProcess, GatewaySpec, running_gateways
from tests.support.metrics import scrape, total
from tests.support.redis_server import RedisProcess, running_redis

ADMIN = "sk-admin-replicas"
CHAT = "/v1/chat/completions"
MODEL = "fault-model"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with running_redis(tmp_path_factory.mktemp("keys-redis"), persist=True) as server:
        yield server


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("keys-upstream") / "upstream.log"
    started = start_upstream(0, "--delay", "0.02", "--chunks", "64", "--tokenize", log=log)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisProcess,
    upstream: FaultUpstreamProcess,
) -> Iterator[list[GatewayProcess]]:
    env = {
        "SLUICEGATE_UPSTREAM_URLS": upstream.url,
        "SLUICEGATE_REDIS_URL": redis_server.url,
        "SLUICEGATE_MANAGED_KEYS": "true",
        "SLUICEGATE_ADMIN_API_KEYS": ADMIN,
        "SLUICEGATE_CACHE_POLICY": "off",
        "SLUICEGATE_MODEL_PRICES": json.dumps({MODEL: {"input": 1.0, "output": 4.0}}),
    }
    folder = tmp_path_factory.mktemp("keys-replicas")
    with running_gateways(folder, GatewaySpec(env=env), GatewaySpec(env=env)) as started:
        yield started


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _create(gateway: GatewayProcess, **settings: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{gateway.url}/admin/keys", json=settings, headers=_auth(ADMIN), timeout=30
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


def _chat(gateway: GatewayProcess, key: str, max_tokens: int = 4) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    return httpx.post(
        gateway.url + CHAT, json={**body, "max_tokens": max_tokens}, headers=_auth(key), timeout=30
    )


def _until(status: int, send: Any) -> None:
    """Once `send()` answers `status` (pytest's timeout bounds one that never does: how fast a
    change reaches the other replica is not asserted here)."""
    while send().status_code != status:
        time.sleep(0.02)


def _ledger(gateway: GatewayProcess, key_id: str, requests: int) -> dict[str, Any]:
    """The key's totals once the ledger holds `requests` requests (writes land in batches)."""
    while True:
        answer = httpx.get(
            f"{gateway.url}/admin/usage", params={"key_id": key_id}, headers=_auth(ADMIN)
        )
        if answer.status_code == 200 and answer.json()["totals"]["requests"] >= requests:
            return dict(answer.json()["totals"])
        time.sleep(0.05)  # pytest's timeout bounds a ledger that never catches up


def test_a_key_change_reaches_the_other_replica(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    created = _create(a, name="crossing", models=[MODEL])
    _until(200, lambda: _chat(b, created["key"]))
    revoked = httpx.delete(f"{b.url}/admin/keys/{created['id']}", headers=_auth(ADMIN))
    assert revoked.status_code == 200
    _until(401, lambda: _chat(a, created["key"]))
    limited = _create(b, models=["some-other-model"])
    _until(404, lambda: _chat(a, limited["key"]))
    expired = _create(a, expires_at="2021-06-01T00:00:00Z")
    refused = _chat(a, expired["key"])
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]
    for key in (created["key"], limited["key"]):
        answer = httpx.get(f"{a.url}/admin/keys", headers=_auth(key))
        assert answer.status_code in (401, 403)
    for gateway in (a, b):
        log = gateway.log()
        for secret in (created["key"], limited["key"], expired["key"]):
            assert secret not in log


def test_the_ledger_counts_every_response_aborted_streams_as_far_as_they_went(
    replicas: list[GatewayProcess],
) -> None:
    a, b = replicas
    created = _create(a)
    key = created["key"]
    _until(200, lambda: _chat(b, key))  # known on both; this request counts too
    whole = [_chat(g, key, max_tokens=6).json()["usage"] for g in (a, b, a)]
    counted = 4
    # Streams cut after a few chunks, on both replicas: 64 tokens asked, a few produced.
    seen = 0
    for gateway in (a, b):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 64,
            "stream": True,
        }
        with httpx.stream(
            "POST", gateway.url + CHAT, json=body, headers=_auth(key), timeout=30
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    seen += 1
                    if seen % 3 == 0:
                        break
        counted += 1
    totals = _ledger(a, created["id"], counted)
    assert totals["requests"] == counted and totals["errors"] == 0
    # The first request (max_tokens 4) and the three whole answers.
    complete = 4 + sum(u["completion_tokens"] for u in whole)
    cut = totals["output_tokens"] - complete
    # What the cut streams produced: at least what the client read, far less than asked.
    assert seen <= cut < 2 * 64
    assert totals["cost"] > 0


def test_a_token_budget_holds_across_both_replicas(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    budget, max_tokens = 100, 8
    created = _create(a, budget={"tokens": budget, "period": "day"})
    _until(200, lambda: httpx.get(f"{b.url}/v1/models", headers=_auth(created["key"])))
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def send(gateway: GatewayProcess) -> None:
        for _ in range(12):
            answer = _chat(gateway, created["key"], max_tokens)
            with lock:
                results.append(answer)

    threads = [threading.Thread(target=send, args=(g,)) for g in (a, b, a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    served = sum(r.json()["usage"]["total_tokens"] for r in results if r.status_code == 200)
    refused = [r for r in results if r.status_code != 200]
    assert refused and {r.json()["error"]["code"] for r in refused} == {"insufficient_quota"}
    assert {r.status_code for r in refused} == {429}
    largest = max(
        r.json()["usage"]["prompt_tokens"] + max_tokens for r in results if r.status_code == 200
    )
    assert budget - largest <= served <= budget


def test_redis_killed_and_restarted_loses_no_usage(
    replicas: list[GatewayProcess], redis_server: RedisProcess
) -> None:
    a, b = replicas
    created = _create(a)
    key = created["key"]
    _until(200, lambda: _chat(b, key))
    _ledger(a, created["id"], 1)
    lost = _lost(a, b)
    redis_server.kill()
    try:
        during = [_chat(g, key) for g in (a, b, a, b)]
        assert [r.status_code for r in during] == [200] * 4
        for gateway in (a, b):
            answer = httpx.post(f"{gateway.url}/admin/keys", json={}, headers=_auth(ADMIN))
            assert answer.status_code == 503
    finally:
        redis_server.start()
    totals = _ledger(a, created["id"], 5)
    assert totals["requests"] == 5
    assert totals["output_tokens"] == 4 + sum(
        r.json()["usage"]["completion_tokens"] for r in during
    )
    assert _lost(a, b) == lost
    assert _create(b)["key"]  # changes work again


def _lost(*gateways: GatewayProcess) -> float:
    """What the replicas' ledgers dropped, in requests."""
    return sum(
        total(scrape(g.url, ADMIN), "sluicegate_usage_lost_total", measure="requests")
        for g in gateways
    )
