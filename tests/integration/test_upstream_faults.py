"""Upstream mode against failing servers: retries, backoff, breakers, aborts, failover.

The upstreams are `tests.support.fault_upstream` processes (a fault-injecting test double speaking
OpenAI's API over real HTTP); the gateways are real `sluicegate serve` processes in upstream
mode. No engine starts, so each gateway is up in seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream
from tests.support.gateway import (
    GatewayProcess,
    free_port,
    running_gateway,
)
from tests.support.metrics import metric_value
from tests.support.redis_server import shared_redis_url

CHAT = {
    "model": "fault-model",
    "messages": [{"role": "user", "content": "Say something."}],
    "max_tokens": 8,
}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[FaultUpstreamProcess]]:
    folder = tmp_path_factory.mktemp("fault")
    started: list[FaultUpstreamProcess] = []
    try:
        for i in range(2):
            log = folder / f"upstream-{i}.log"
            started.append(start_upstream(0, "--delay", "0.001", log=log))
        yield started
    finally:
        for upstream in started:
            upstream.stop()


@pytest.fixture(autouse=True)
def normal(upstreams: list[FaultUpstreamProcess]) -> None:
    for upstream in upstreams:
        upstream.control(reset_all=True)
        upstream.control(reset_stats=True)


class Where(NamedTuple):
    """Where a test's gateway logs, the transport it speaks to its upstreams over, and how
    many workers it runs."""

    log_dir: Path
    transport: str
    workers: int = 1


def _env(where: Where, urls: list[str], **settings: str) -> dict[str, str]:
    # Several workers need Redis (the Responses store); each keeps its own pools and breakers.
    # Keys of the gateway's own in it: nothing a test counts there (a key's tokens) is left
    # for the next test's gateway.
    shared = (
        {
            "SLUICEGATE_REDIS_URL": shared_redis_url(),
            "SLUICEGATE_REDIS_KEY_PREFIX": f"faults-{uuid.uuid4().hex[:12]}",
        }
        if where.workers > 1
        else {}
    )
    env = {
        "SLUICEGATE_UPSTREAM_URLS": ",".join(urls),
        "SLUICEGATE_UPSTREAM_TRANSPORT": where.transport,
        "SLUICEGATE_WORKERS": str(where.workers),
        # A test's kept-alive connection outlives its waits (see `_client`).
        "SLUICEGATE_KEEP_ALIVE_TIMEOUT": "120",
        **shared,
        "SLUICEGATE_CACHE_POLICY": "off",
        "SLUICEGATE_UPSTREAM_HEALTH_INTERVAL": "0.5",
        # Each probe may take 0.5 s: six late in a row (3 s of a loaded machine's stall), not
        # three, take an upstream out from under a test that is not about its health.
        "SLUICEGATE_UPSTREAM_HEALTH_FAILURES": "6",
        **{f"SLUICEGATE_{k.upper()}": v for k, v in settings.items()},
    }
    return env


_clients: dict[int, httpx.Client] = {}


def _client(gateway: GatewayProcess) -> httpx.Client:
    """One kept-alive connection to the gateway, so that a test's requests all meet the same
    worker: with several workers each keeps its own pools, breakers, health, retry budget and
    upstreams' Retry-After (docs/operations.md), and a new connection may go to either."""
    client = _clients.get(gateway.port)
    if client is None:
        limits = httpx.Limits(max_connections=1, keepalive_expiry=120)
        client = _clients[gateway.port] = httpx.Client(
            base_url=gateway.url, timeout=30, limits=limits
        )
    return client


SETUPS = {"aiohttp-one-worker": ("aiohttp", 1), "httpcore-one-worker": ("httpcore", 1)}
SETUPS["aiohttp-two-workers"] = ("aiohttp", 2)
"""Every test runs over both upstream transports (engine/upstream/transport.py) and with one
worker and with two (`SLUICEGATE_WORKERS`): each axis whole, not their product. Nothing a
transport does depends on how many workers share the port (each worker has its own pools,
breakers and retry budget), and the fourth pairing's 21 gateways of two workers cost the
suite 3 to 5 minutes."""


@pytest.fixture(scope="module", params=list(SETUPS.values()), ids=list(SETUPS))
def setup(request: pytest.FixtureRequest) -> tuple[str, int]:
    transport, workers = request.param
    return str(transport), int(workers)


@pytest.fixture
def gateway_dir(tmp_path: Path, setup: tuple[str, int]) -> Where:
    return Where(tmp_path, *setup)


def _events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def test_retries_honour_retry_after_and_then_succeed(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url]) as gateway:
        upstream.control(status=503, retry_after=1, times=2)
        started = time.monotonic()
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        arrivals = upstream.arrivals()
        assert len(arrivals) == 3
        # One upstream only: each retry waits the second its Retry-After asked for.
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert all(gap >= 0.95 for gap in gaps), gaps
        assert time.monotonic() - started >= 1.9
        label = upstream.url
        assert metric_value(gateway.url, "sluicegate_upstream_retries_total", upstream=label) == 2
        assert (
            metric_value(
                gateway.url, "sluicegate_upstream_requests_total", upstream=label, outcome="ok"
            )
            == 1
        )


def test_retries_give_up_with_the_upstreams_error(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url], upstream_max_retries="2") as gateway:
        upstream.control(status=502)
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 502
        error = reply.json()["error"]
        assert error["type"] == "upstream_error" and error["message"]
        assert len(upstream.arrivals()) == 3  # the first try and two retries
        # A refusal (400) is the upstream's answer: passed on, never retried.
        upstream.control(status=400)
        refused = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert len(upstream.arrivals()) == 4


@contextlib.contextmanager
def _tripped(
    where: Where, upstream: FaultUpstreamProcess, open_seconds: float
) -> Iterator[GatewayProcess]:
    """A gateway whose breaker for `upstream` has just opened (three failures in a row,
    nothing retried), stopped when the block ends."""
    with _serving(
        where,
        [upstream.url],
        upstream_max_retries="0",
        upstream_breaker_failures="3",
        upstream_breaker_open_seconds=str(open_seconds),
    ) as gateway:
        upstream.control(status=500)
        for _ in range(3):
            reply = _client(gateway).post("/v1/chat/completions", json=CHAT, timeout=30)
            assert reply.status_code == 502
        yield gateway


def test_an_open_breaker_refuses_without_reaching_the_upstream(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    # Open for longer than any test runs: on a loaded machine, even 5 s once passed between
    # the third failure and the next request (the breaker was half-open by then, and let it
    # through). The half-open state has its own test below.
    with _tripped(gateway_dir, upstream, open_seconds=3600) as gateway:
        label = upstream.url
        assert metric_value(gateway.url, "sluicegate_upstream_breaker_state", upstream=label) == 1
        reached = len(upstream.arrivals())
        upstream.control(reset_all=True)  # the upstream would answer now: the breaker refuses
        reply = _client(gateway).post("/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 503
        assert reply.json()["error"]["message"] == "No upstream is available."
        assert len(upstream.arrivals()) == reached
        assert metric_value(gateway.url, "sluicegate_upstream_breaker_state", upstream=label) == 1


_OPEN_SECONDS = 1.0


def test_a_half_open_breaker_lets_a_trial_through_and_its_success_closes_it(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _tripped(gateway_dir, upstream, open_seconds=_OPEN_SECONDS) as gateway:
        upstream.control(reset_all=True)
        label = upstream.url
        # Half-open once its seconds are over (polled from then: a fixed wait is no deadline
        # for a loaded machine).
        waited = time.monotonic()
        time.sleep(_OPEN_SECONDS)
        while (
            state := metric_value(gateway.url, "sluicegate_upstream_breaker_state", upstream=label)
        ) != 2:
            late = time.monotonic() - waited
            assert late < _OPEN_SECONDS + 15, f"the breaker's state is still {state:g}"
            time.sleep(0.1)
        # Half-open: the trial request succeeds and closes it.
        reached = len(upstream.arrivals())
        reply = _client(gateway).post("/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200
        assert len(upstream.arrivals()) == reached + 1
        assert metric_value(gateway.url, "sluicegate_upstream_breaker_state", upstream=label) == 0


def test_nothing_is_retried_after_the_first_byte(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url]) as gateway:
        upstream.control(reset="during", after_chunks=3)
        body = {**CHAT, "stream": True, "max_tokens": 16}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            events = _events(reply)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "upstream_error"
        text = "".join(
            c["delta"].get("content") or "" for e in events[:-2] for c in json.loads(e)["choices"]
        )
        assert text  # what came before the reset reached the client
        assert len(upstream.arrivals()) == 1  # and the request was not sent again


def test_a_client_disconnect_closes_the_upstream_request(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    # With HTTP/2 on: offered over TLS only, so plain http here stays HTTP/1.1.
    with _serving(gateway_dir, [upstream.url], upstream_http2="true") as gateway:
        upstream.control(slow=0.2)
        body = {**CHAT, "stream": True, "max_tokens": 32}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as reply:
            for line in reply.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break
            left = time.monotonic()
        # Noticed at the upstream's next write (0.2 s apart); the bound, under the 6 s the
        # 32 tokens would take to end by themselves, leaves room for a loaded machine.
        deadline = left + 10
        while time.monotonic() < deadline and not upstream.stats()["disconnects"]:
            time.sleep(0.05)
        noticed = upstream.stats()["disconnects"]
        assert noticed, "the upstream never saw its client leave"
        after = noticed[0] - left  # type: ignore[index,operator]
        requests = metric_value(gateway.url, "sluicegate_upstream_requests_total")
        assert after < 3.0, (
            f"the upstream saw its client leave {after:.2f} s after the client did; the "
            f"gateway's upstream requests: {requests:g}"
        )
        assert upstream.stats()["in_flight"] == 0


def test_two_upstreams_one_down_every_request_succeeds(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    up, flaky = upstreams
    flaky.control(reset="before")
    # Two failing upstreams fail up to 2 x 5 tries (the breaker's failures) before both
    # breakers open, each retried: a reserve of 10 retries, not the default 5 (one upstream).
    with _serving(
        gateway_dir,
        [dead, flaky.url, up.url],
        upstream_health_interval="5",
        upstream_retry_burst="10",
    ) as gateway:
        for stream in (False, True) * 10:
            body = {**CHAT, "stream": stream}
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text
            if stream:
                assert reply.text.rstrip().endswith("data: [DONE]")
                assert '"error"' not in reply.text
        assert len(up.arrivals()) == 20
        retries = metric_value(gateway.url, "sluicegate_upstream_retries_total")
        assert retries >= 1
        ready = httpx.get(gateway.url + "/ready")
        assert ready.status_code == 200


def test_ready_is_503_while_no_upstream_is_healthy(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url]) as gateway:
        assert _client(gateway).get("/ready").status_code == 200
        upstream.control(down=True)
        # Probes run every 0.5 s: 20 s bounds a hang, with room for a loaded machine.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _client(gateway).get("/ready").status_code == 200:
            time.sleep(0.1)
        assert _client(gateway).get("/ready").status_code == 503
        assert metric_value(gateway.url, "sluicegate_upstream_healthy", upstream=upstream.url) == 0
        upstream.control(reset_all=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _client(gateway).get("/ready").status_code != 200:
            time.sleep(0.1)
        assert _client(gateway).get("/ready").status_code == 200


def test_without_a_tokenizer_the_budget_is_off_and_usage_comes_from_the_upstream(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    # Two tokens a minute refill each second. With two workers the tokens are counted in
    # Redis; on a loaded machine Redis once answered later than the default 250 ms, and the
    # worker counted its own share instead (as it should: test_redis_resilience.py), which
    # is not what this test reads: Redis has longer here.
    with _serving(
        gateway_dir,
        [upstream.url],
        rate_limit_tokens_per_minute="120",
        rate_limit_redis_timeout="10",
    ) as gateway:
        long = {**CHAT, "messages": [{"role": "user", "content": "word " * 60}]}
        direct = httpx.post(upstream.url + "/chat/completions", json=long).json()["usage"]
        assert direct["prompt_tokens"] >= 50
        started = time.monotonic()
        # One connection (`_client`): both requests meet the same worker, whose headers say
        # what it has counted (with two, each holds headroom of its own: docs/operations.md).
        reply = _client(gateway).post("/v1/chat/completions", json=long, timeout=30)
        assert reply.status_code == 200
        assert reply.json()["usage"] == direct
        assert "x-budget-prompt-tokens-after" not in reply.headers
        # The prompt tokens only the upstream counted are charged when the run ends.
        left = int(reply.headers["x-ratelimit-remaining-tokens"])
        after = _client(gateway).post("/v1/chat/completions", json=CHAT, timeout=30)
        refilled = math.ceil(2 * (time.monotonic() - started))
        used = left - int(after.headers["x-ratelimit-remaining-tokens"])
        # The first run's prompt and completion, less what refilled meanwhile (timed, not
        # assumed: a loaded machine may take seconds between the two).
        assert used >= direct["total_tokens"] - refilled
        # No /tokenize on the upstream (404): said at start-up.
        assert "has no usable /tokenize" in gateway.log()
        assert "the token budget is off for fault-model" in gateway.log()
        tokenize = httpx.post(gateway.url + "/tokenize", json={"prompt": "hi"})
        assert tokenize.status_code == 400 and tokenize.json()["error"]["message"]
        echo = {"model": "fault-model", "prompt": "hi", "echo": True, "max_tokens": 2}
        refused = httpx.post(gateway.url + "/v1/completions", json=echo)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"


def test_a_stall_before_the_first_byte_is_a_timeout_retried_on_another_upstream(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    stalled, up = upstreams
    # Weighted 1000:1, the stalled upstream is nearly always the first pick.
    with _serving(
        gateway_dir,
        [stalled.url, up.url],
        upstream_weights="1000,1",
        upstream_read_timeout="0.5",
    ) as gateway:
        sent = 0
        # Before the headers, then after them (the answer's first chunk never comes).
        for stall in ({"stall": 10}, {"stall": 10, "after_chunks": 0}):
            stalled.control(**stall)
            tried = len(stalled.arrivals())
            while len(stalled.arrivals()) == tried and sent < 8:
                body = {**CHAT, "stream": "after_chunks" in stall}
                reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
                sent += 1
                assert reply.status_code == 200, reply.text
                assert '"error"' not in reply.text
        stalls = len(stalled.arrivals())
        assert stalls == 2
        assert len(up.arrivals()) == sent  # every request was answered by the other one
        label = stalled.url
        requests = "sluicegate_upstream_requests_total"
        assert metric_value(gateway.url, requests, upstream=label, outcome="timeout") == stalls
        assert metric_value(gateway.url, requests, upstream=label, outcome="reset") == 0
        retries = metric_value(gateway.url, "sluicegate_upstream_retries_total", upstream=label)
        assert retries == stalls
        # Not on the same upstream again: with both stalled, one try each, then a 504.
        up.control(stall=10)
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 504
        assert reply.json()["error"]["type"] == "timeout_error"
        assert (len(stalled.arrivals()), len(up.arrivals())) == (stalls + 1, sent + 1)


def test_retries_stop_when_the_retry_budget_is_spent(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(
        gateway_dir,
        [upstream.url],
        upstream_max_retries="2",
        upstream_retry_backoff="0.001",
        upstream_retry_budget="0.2",
        upstream_retry_burst="2",
        upstream_breaker_failures="1000",
        upstream_breaker_window="1000",
    ) as gateway:
        upstream.control(status=502)
        requests = 10
        for _ in range(requests):
            reply = _client(gateway).post("/v1/chat/completions", json=CHAT, timeout=30)
            assert reply.status_code == 502
        hits = len(upstream.arrivals())
        # Unbounded, each request would be tried 3 times (30 hits). The budget allows the
        # reserve of 2, then 0.2 of a retry per request: 2 + 2.
        assert requests + 2 <= hits <= requests + 2 + 2, hits
        assert metric_value(gateway.url, "sluicegate_upstream_retries_total") == hits - requests
        denied = metric_value(gateway.url, "sluicegate_upstream_retries_denied_total")
        assert denied >= requests - 2 - 2


def test_the_served_model_name_aliases_the_upstreams_model(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url], served_model_name="house-model") as gateway:
        cards = httpx.get(gateway.url + "/v1/models").json()["data"]
        assert [(c["id"], c["root"]) for c in cards] == [("house-model", "fault-model")]
        for stream in (False, True):
            body = {**CHAT, "model": "house-model", "stream": stream}
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text
            assert '"model":"house-model"' in reply.text.replace(" ", "")
        # The upstream was asked for its own model, by its own name.
        assert upstream.stats()["models"] == {"fault-model": 2}
        unknown = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"


def test_sequential_requests_reuse_the_upstream_connections(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(gateway_dir, [upstream.url], upstream_health_interval="60") as gateway:
        # Every worker answers once first: a worker's start-up health probe may still hold its
        # pool's connection when its first request comes, which then opens a second one. The
        # connections of start-up are left out.
        _answered_by_every_worker(gateway, gateway_dir.workers)
        upstream.control(reset_stats=True)
        requests = 20
        for stream in (False, True) * (requests // 2):
            body = {**CHAT, "stream": stream}
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text
        stats = upstream.stats()
        assert len(upstream.arrivals()) == requests
        # A response closed before its end closes its connection: one per request.
        assert stats["connections_accepted"] <= 2, stats["connections_accepted"]


def _answered_by_every_worker(gateway: GatewayProcess, workers: int) -> None:
    """Requests on new connections until each of the gateway's workers has answered one (the
    kernel deals connections out to them by their ports, SO_REUSEPORT)."""
    seen: set[str] = set()
    for _ in range(64):
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200, reply.text
        seen.add(reply.headers.get("x-sluicegate-worker", "0"))
        if len(seen) == workers:
            return
    raise AssertionError(f"64 connections all went to the workers {sorted(seen)}")


@contextlib.contextmanager
def _serving(where: Where, urls: list[str], **settings: str) -> Iterator[GatewayProcess]:
    """A gateway in upstream mode over `urls`, started by the shared helper (which stops it
    however the block ends), with the settings these tests share and `settings` on top."""
    with running_gateway(where.log_dir, env=_env(where, urls, **settings)) as gateway:
        yield gateway


def _content(events: list[str]) -> str:
    """The text of a chat stream's events (`data:` payloads, `[DONE]` left out)."""
    return "".join(
        c["delta"].get("content") or ""
        for e in events
        if e != "[DONE]"
        for c in json.loads(e)["choices"]
    )


def _chat(gateway: GatewayProcess, body: dict[str, object] | None = None) -> httpx.Response:
    return _client(gateway).post("/v1/chat/completions", json=body or CHAT, timeout=30)


def _until_served(gateway: GatewayProcess, within: float) -> float:
    """Seconds until a request is answered 200; fails after `within`."""
    started = time.monotonic()
    while (reply := _chat(gateway)).status_code != 200:
        assert time.monotonic() - started < within, reply.text
        time.sleep(0.1)
    return time.monotonic() - started


def test_an_endless_retry_after_is_clamped_and_a_good_probe_ends_a_503s_wait(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(
        gateway_dir, [upstream.url], upstream_max_retries="0", upstream_retry_after_max="30"
    ) as gateway:
        # `inf` was a 500 (round(inf)); now it is as long as the bound, and passed on so.
        upstream.control(status=503, retry_after="inf", times=1)
        reply = _chat(gateway)
        assert reply.status_code == 503, reply.text
        assert reply.headers["retry-after"] == "30"
        # The health probes (every 0.5 s) end its wait: back within 20 s, well before the
        # 30 s bound would (a safety margin for a loaded machine, not a figure).
        _until_served(gateway, within=20)
        # 1e9 s kept a healthy upstream out until the gateway restarted; 30 s at most now,
        # and the next good probe ends it sooner.
        upstream.control(status=503, retry_after=1e9, times=1)
        reply = _chat(gateway)
        assert reply.status_code == 503 and reply.headers["retry-after"] == "30"
        _until_served(gateway, within=20)


def test_a_429s_retry_after_is_clamped_and_kept_through_good_probes(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(
        gateway_dir, [upstream.url], upstream_max_retries="0", upstream_retry_after_max="10"
    ) as gateway:
        upstream.control(status=429, retry_after=1e9, times=1)
        limited = time.monotonic()
        reply = _chat(gateway)
        assert reply.status_code == 429 and reply.headers["retry-after"] == "10"
        # Four good probes: a rate limit is not theirs to lift. The 8 s left of the wait
        # leave room for a loaded machine's stalls before the next request (a breaker's
        # 5 s once did not).
        time.sleep(2)
        assert _chat(gateway).status_code == 503
        _until_served(gateway, within=25)
        # A lower bound: the rate limit's wait was kept, not lifted by the probes (a busy
        # machine only makes it later).
        assert time.monotonic() - limited >= 9.5
        assert len(upstream.arrivals()) == 2  # nothing was sent while it was out


def test_a_slow_client_holds_the_upstream_back_instead_of_the_gateway_buffering(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    chunks, size = 1024, 64 * 1024  # a 64 MiB answer
    with _serving(gateway_dir, [upstream.url]) as gateway:
        upstream.control(chunks=chunks, chunk_bytes=size)
        body = {**CHAT, "stream": True, "max_tokens": chunks}
        with httpx.stream(
            "POST", gateway.url + "/v1/chat/completions", json=body, timeout=60
        ) as reply:
            assert reply.status_code == 200
            raw = reply.iter_raw()
            received = [next(raw)]  # then the client stops reading, for a while
            sent, still = -1, 0.0
            deadline = time.monotonic() + 20  # well within STREAM_STALL_TIMEOUT (60 s)
            while still < 1.0 and time.monotonic() < deadline:
                now = int(upstream.stats()["sent_bytes"])  # type: ignore[call-overload]
                still = still + 0.2 if now == sent else 0.0
                sent = now
                time.sleep(0.2)
            # Unbounded, the gateway read all 64 MiB while the client read nothing. Bounded,
            # the upstream is held back once the sockets' buffers (a few MB) are full.
            print(f"the upstream sent {sent:,} of {chunks * size:,} bytes while held back")
            assert sent < chunks * size // 2, sent
            received += list(raw)
        events = [line[6:] for line in b"".join(received).decode().splitlines() if line]
        assert events[-1] == "[DONE]"
        assert len(_content(events)) == chunks * size  # nothing was lost for the wait


def test_an_upstream_refusing_the_gateways_credentials_is_a_502_and_a_failure(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(
        gateway_dir,
        [upstream.url],
        upstream_max_retries="0",
        upstream_breaker_failures="2",
        upstream_breaker_open_seconds="60",
    ) as gateway:
        label = upstream.url
        for status in (401, 403):
            upstream.control(status=status, times=1)
            reply = _chat(gateway)
            assert reply.status_code == 502, reply.text
            error = reply.json()["error"]
            assert error["type"] == "upstream_error" and error["code"] == "upstream_error"
            assert error["message"] == "The upstream server refused the gateway's credentials."
        # The upstream's words go to the log, with its address; the client's key was fine.
        assert f"upstream {label} refused the gateway's credentials (401): injected 401" in (
            gateway.log()
        )
        requests = "sluicegate_upstream_requests_total"
        assert metric_value(gateway.url, requests, upstream=label, outcome="auth_error") == 2
        assert metric_value(gateway.url, requests, upstream=label, outcome="ok") == 0
        # Two failures in a row: its breaker is open.
        assert metric_value(gateway.url, "sluicegate_upstream_breaker_state", upstream=label) == 1


def test_refusals_of_the_request_pass_through_with_their_status_and_no_address(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    with _serving(
        gateway_dir, [upstream.url], upstream_max_retries="0", upstream_read_timeout="0.5"
    ) as gateway:
        for status in (400, 404, 422):
            upstream.control(status=status, times=1)
            reply = _chat(gateway)
            assert reply.status_code == status, reply.text
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["message"] == f"injected {status}"
        requests = "sluicegate_upstream_requests_total"
        assert (
            metric_value(gateway.url, requests, upstream=upstream.url, outcome="client_error") == 3
        )
        # Failures say what failed, not where: the upstream's address is for logs and metrics.
        address = f"127.0.0.1:{upstream.port}"
        for fault in ({"reset": "before"}, {"stall": 5}):
            upstream.control(**fault)
            failed = _chat(gateway)
            assert failed.status_code in (502, 504) and address not in failed.text, failed.text
        upstream.control(reset_all=True)
        _until_served(gateway, within=10)
        stream = {**CHAT, "stream": True}
        upstream.control(reset="during", after_chunks=2)
        cut = httpx.post(gateway.url + "/v1/chat/completions", json=stream, timeout=30)
        assert "upstream_stream_error" in cut.text and address not in cut.text
        assert address in gateway.log()


def test_a_failed_try_with_nowhere_left_to_retry_gets_its_own_error(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    # Its first failure opens the breaker: the retry finds no upstream available.
    with _serving(
        gateway_dir,
        [upstream.url],
        upstream_max_retries="2",
        upstream_breaker_failures="1",
        upstream_breaker_open_seconds="3600",  # still open at the retry, however late
    ) as gateway:
        upstream.control(reset="before")
        reply = _chat(gateway)
        assert reply.status_code == 502, reply.text  # not 503 "No upstream is available."
        assert reply.json()["error"]["message"] == "The upstream server closed the connection."
        assert len(upstream.arrivals()) == 1


def test_the_gateways_internal_priority_is_not_sent_upstream(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    key = "sk-upstream-priority"
    key_id = "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    with _serving(
        gateway_dir,
        [upstream.url],
        scheduling_policy="priority",
        api_keys=key,
        key_priorities=json.dumps({key_id: 1}),
    ) as gateway:
        for priority in (0, 3):
            reply = httpx.post(
                gateway.url + "/v1/chat/completions",
                json={**CHAT, "priority": priority},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
        # Its rank (1 x 2^40 + 3 + ...) was sent before: vLLM's server refuses any priority
        # unless it schedules by priority, a sluicegate upstream any past int32.
        assert upstream.stats()["priorities"] == {"None": 2}


def test_content_holding_a_record_separator_reaches_the_client_as_it_is(
    upstreams: list[FaultUpstreamProcess], gateway_dir: Where
) -> None:
    upstream = upstreams[0]
    words = ["a\x1eb", " \x1e{}\x1e", " c"]
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
    with _serving(gateway_dir, [upstream.url]) as gateway:
        upstream.control(words=words)
        for extra in ({}, {"tools": [tool], "tool_choice": "none"}, {"tools": [tool]}):
            for stream in (False, True):
                reply = _chat(gateway, {**CHAT, **extra, "stream": stream})
                assert reply.status_code == 200, reply.text
                if stream:
                    text = _content(_events_of(reply.text))
                else:
                    text = reply.json()["choices"][0]["message"]["content"]
                assert text == "".join(words), (extra, stream, text)


def _events_of(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: {")]
