"""Gateways on a real Redis (their own server, so it can be killed): rate limits and the
response cache through Redis faults under load, both shared by two replicas, the Responses
API's store shared by them, and each replica's share of the limits while Redis is down."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from sluicegate.keys import ApiKeyring
from tests.support.gateway import MODEL_NAME, GatewayProcess, GatewaySpec, running_gateways
from tests.support.metrics import metric_value
from tests.support.redis_server import RedisProcess, running_redis

BUSY_KEY = "sk-busy-7c1e"  # limits far above what the test sends
SHARED_KEY = "sk-shared-42d9"  # 60 requests per minute, across replicas
LOCAL_KEY = "sk-local-9b3f"  # 20 requests per minute; half of it per replica without Redis
RPM = 60
LOCAL_RPM, LOCAL_SHARE = 20, 0.5
BODY = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def cacheable(text: str, max_tokens: int = 4) -> dict[str, object]:
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def key_id(key: str) -> str:
    found = ApiKeyring.parse(key).identify(key)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def test_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


def gateway_env(redis_url: str) -> dict[str, str]:
    overrides = {
        key_id(BUSY_KEY): {"requests_per_minute": 100_000},
        key_id(SHARED_KEY): {"requests_per_minute": RPM},
        key_id(LOCAL_KEY): {"requests_per_minute": LOCAL_RPM},
    }
    return {
        "SLUICEGATE_API_KEYS": f"{BUSY_KEY},{SHARED_KEY},{LOCAL_KEY}",
        "SLUICEGATE_RATE_LIMIT_LOCAL_SHARE": str(LOCAL_SHARE),
        "SLUICEGATE_REDIS_URL": redis_url,
        "SLUICEGATE_RATE_LIMIT_OVERRIDES": json.dumps(overrides),
        # Above the defaults (50 ms, 250 ms): these replicas share two cores with two more
        # engines (the other lane's, fifty requests at once), and a stalled event loop must
        # not be taken for a Redis failure. The faults injected are kills (refused at once)
        # and a 1.5 s pause, well past these.
        "SLUICEGATE_CACHE_REDIS_TIMEOUT": "1.0",
        "SLUICEGATE_RATE_LIMIT_REDIS_TIMEOUT": "1.0",
    }


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, test_redis: RedisProcess
) -> Iterator[list[GatewayProcess]]:
    spec = GatewaySpec(env=gateway_env(test_redis.url))
    with running_gateways(tmp_path_factory.mktemp("replicas"), spec, spec) as gateways:
        yield gateways


@pytest.fixture(scope="module")
def replica_a(replicas: list[GatewayProcess]) -> GatewayProcess:
    return replicas[0]


@pytest.fixture(scope="module")
def replica_b(replicas: list[GatewayProcess]) -> GatewayProcess:
    return replicas[1]


async def test_redis_killed_paused_and_restarted_under_load_fails_nothing(
    replica_a: GatewayProcess, test_redis: RedisProcess
) -> None:
    errors_before = metric_value(replica_a.url, "sluicegate_rate_limit_store_errors_total")
    cache_errors_before = metric_value(replica_a.url, "sluicegate_cache_store_errors_total")
    statuses: list[int] = []
    headers_seen: list[bool] = []
    stop = asyncio.Event()

    async def worker(client: httpx.AsyncClient, index: int) -> None:
        sent = 0
        while not stop.is_set():
            # Half the workers send cacheable requests (a few distinct prompts, so there are
            # hits, misses and writes all through the faults); the others are never cached.
            body = cacheable(f"Count to {sent % 3} please.") if index % 2 else BODY
            response = await client.post("/v1/chat/completions", json=body)
            statuses.append(response.status_code)
            headers_seen.append("x-ratelimit-remaining-requests" in response.headers)
            sent += 1

    auth = {"authorization": f"Bearer {BUSY_KEY}"}
    async with httpx.AsyncClient(base_url=replica_a.url, headers=auth, timeout=60) as client:
        workers = [asyncio.create_task(worker(client, i)) for i in range(4)]
        await asyncio.sleep(2)
        test_redis.kill()
        await asyncio.sleep(3)
        test_redis.start()
        await asyncio.sleep(3)
        test_redis.pause(1.5)
        await asyncio.sleep(3)
        test_redis.kill()
        await asyncio.sleep(2)
        test_redis.start()
        await asyncio.sleep(4)
        stop.set()
        await asyncio.gather(*workers)

    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    assert metric_value(replica_a.url, "sluicegate_rate_limit_store_errors_total") > errors_before
    assert all(headers_seen[-4:]), "limits apply again once Redis is back"
    log = await asyncio.to_thread(replica_a.log)
    assert "rate-limit store failed" in log and "cache store" in log
    assert metric_value(replica_a.url, "sluicegate_cache_store_errors_total") > cache_errors_before

    # Caching resumed: a new prompt is stored in the restarted Redis and then served from it.
    async with httpx.AsyncClient(base_url=replica_a.url, headers=auth, timeout=60) as client:
        body = cacheable("After the restart, name a colour.")
        first = await client.post("/v1/chat/completions", json=body)
        second = await client.post("/v1/chat/completions", json=body)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "HIT")
    assert second.json()["choices"] == first.json()["choices"]


async def test_fifty_identical_requests_on_two_replicas_generate_once(
    replica_a: GatewayProcess, replica_b: GatewayProcess
) -> None:
    """Single flight across processes: one replica generates; the other waits on its lock."""
    replicas = (replica_a, replica_b)
    generated = "vllm:request_success_total"
    before = [metric_value(r.url, generated) for r in replicas]
    body = cacheable("Write one sentence about rivers.", max_tokens=48)
    auth = {"authorization": f"Bearer {BUSY_KEY}"}
    async with (
        httpx.AsyncClient(base_url=replica_a.url, headers=auth, timeout=120) as a,
        httpx.AsyncClient(base_url=replica_b.url, headers=auth, timeout=120) as b,
    ):
        responses = await asyncio.gather(
            *((a, b)[i % 2].post("/v1/chat/completions", json=body) for i in range(50))
        )
    assert [r.status_code for r in responses] == [200] * 50
    after = [metric_value(r.url, generated) for r in replicas]
    assert sum(after) - sum(before) == 1, (before, after)
    assert sorted(r.headers["x-cache"] for r in responses) == ["HIT"] * 49 + ["MISS"]
    assert len({json.dumps(r.json()["choices"]) for r in responses}) == 1


def test_a_stored_response_is_read_by_the_other_replica_and_only_under_its_key(
    replica_a: GatewayProcess, replica_b: GatewayProcess
) -> None:
    """The Responses API's store on Redis: what one gateway process stores, another reads
    and continues (as after a restart); another key finds nothing."""
    busy = {"authorization": f"Bearer {BUSY_KEY}"}
    other = {"authorization": f"Bearer {LOCAL_KEY}"}
    body = {"model": MODEL_NAME, "input": "Say hi.", "max_output_tokens": 4, "temperature": 0}
    created = httpx.post(f"{replica_a.url}/v1/responses", json=body, headers=busy, timeout=60)
    assert created.status_code == 200
    response_id = created.json()["id"]
    read = httpx.get(f"{replica_b.url}/v1/responses/{response_id}", headers=busy, timeout=10)
    assert read.status_code == 200 and read.json() == created.json()
    for url in (replica_a.url, replica_b.url):
        hidden = httpx.get(f"{url}/v1/responses/{response_id}", headers=other, timeout=10)
        assert hidden.status_code == 404
    follow = {**body, "input": "Again.", "previous_response_id": response_id}
    continued = httpx.post(f"{replica_b.url}/v1/responses", json=follow, headers=busy, timeout=60)
    assert continued.status_code == 200
    usage = created.json()["usage"]
    assert continued.json()["usage"]["input_tokens"] > usage["total_tokens"]
    deleted = httpx.delete(f"{replica_b.url}/v1/responses/{response_id}", headers=busy)
    assert deleted.json() == {"id": response_id, "object": "response", "deleted": True}
    gone = httpx.get(f"{replica_a.url}/v1/responses/{response_id}", headers=busy, timeout=10)
    assert gone.status_code == 404


async def both_on_redis(replicas: list[str]) -> None:
    """Wait until neither replica enforces its own share any more: a Redis failure in an
    earlier test (a kill, or a late answer under load) keeps a replica on its share for the
    retry interval, and a request after it takes it back to Redis."""
    auth = {"authorization": f"Bearer {BUSY_KEY}"}
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(timeout=60, headers=auth) as client:
        while True:
            for url in replicas:
                await client.post(f"{url}/v1/chat/completions", json=BODY)
            if all(metric_value(url, "sluicegate_rate_limit_local") == 0 for url in replicas):
                return
            assert time.monotonic() < deadline, "a replica stayed on its local share for 30 s"
            await asyncio.sleep(0.5)


async def test_two_replicas_share_one_limit(
    replica_a: GatewayProcess, replica_b: GatewayProcess
) -> None:
    """GCRA: the whole minute's 60 at once, then one a second. At three a second the burst
    lasts 30 s (90 admitted), then one in three is admitted: 100 in 40 s, and never more
    than 60 + 60 * d / 60 in d seconds."""
    auth = {"authorization": f"Bearer {SHARED_KEY}"}
    replicas = [replica_a.url, replica_b.url]
    statuses: list[int] = []

    async def send(client: httpx.AsyncClient, url: str) -> None:
        response = await client.post(f"{url}/v1/chat/completions", json=BODY, headers=auth)
        if response.status_code != 200:
            assert response.status_code == 429, response.text
            assert int(response.headers["retry-after"]) >= 1
        statuses.append(response.status_code)

    await both_on_redis(replicas)
    local = "sluicegate_rate_limit_local_decisions_total"
    local_before = sum(metric_value(url, local) for url in replicas)
    # Three requests a second, alternating replicas, sent on time however long each takes.
    async with httpx.AsyncClient(timeout=60) as client:
        started = time.monotonic()
        sends = []
        for sent in range(120):
            await asyncio.sleep(max(0.0, started + sent / 3 - time.monotonic()))
            sends.append(asyncio.create_task(send(client, replicas[sent % 2])))
        await asyncio.gather(*sends)
        elapsed = time.monotonic() - started
    admitted, refused = statuses.count(200), statuses.count(429)
    # Checks that Redis answered late were decided by a replica's share (`redis_limiter`).
    late = sum(metric_value(url, local) for url in replicas) - local_before
    print(
        f"sent {len(statuses)}, admitted {admitted}, refused {refused} in {elapsed:.1f} s; "
        f"{late:.0f} checks decided locally"
    )
    assert admitted <= RPM + int(RPM * elapsed / 60) + 1
    assert admitted >= RPM + int(RPM * 30 / 60) - 5, "the limit was reachable"
    assert refused > 0


async def test_with_redis_down_each_replica_enforces_its_share(
    replica_a: GatewayProcess, test_redis: RedisProcess
) -> None:
    auth = {"authorization": f"Bearer {LOCAL_KEY}"}
    local_before = metric_value(replica_a.url, "sluicegate_rate_limit_local_decisions_total")
    test_redis.kill()
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=replica_a.url, headers=auth, timeout=60) as client:
        started = time.monotonic()
        for _ in range(30):
            response = await client.post("/v1/chat/completions", json=BODY)
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert response.headers["x-ratelimit-limit-requests"] == "10"
        elapsed = time.monotonic() - started
        admitted = statuses.count(200)
        print(f"Redis down: 30 sent in {elapsed:.1f} s, {admitted} admitted")
        share = int(LOCAL_RPM * LOCAL_SHARE)
        assert set(statuses) == {200, 429}
        assert share <= admitted <= share + int(share * elapsed / 60)
        local_after = metric_value(replica_a.url, "sluicegate_rate_limit_local_decisions_total")
        assert local_after - local_before >= 30
        assert metric_value(replica_a.url, "sluicegate_rate_limit_local") == 1

        # Redis back (empty): the limits are shared through it again.
        test_redis.start()
        deadline = time.monotonic() + 10
        while True:
            await asyncio.sleep(0.5)
            response = await client.post("/v1/chat/completions", json=BODY)
            if response.headers.get("x-ratelimit-limit-requests") == str(LOCAL_RPM):
                break
            assert time.monotonic() < deadline, "the limits did not go back to Redis"
    assert response.status_code == 200
    assert metric_value(replica_a.url, "sluicegate_rate_limit_local") == 0
