"""Two workers over one real engine (`SLUICEGATE_WORKERS=2`): both answer, one scrape counts
both, aborts from either reach the engine, a key's share holds across them, a drain takes
streams on both, and the engine's death ends both with code 3.

Which worker served a request is in its response's `X-Sluicegate-Worker` header; the kernel
spreads new connections over the workers by a hash of the client's port, so tests send until
both have answered.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from sluicegate.lifecycle import ENGINE_DEATH_EXIT_CODE
from tests.support.gateway import MODEL_NAME, GatewayProcess, GatewaySpec, running_gateways
from tests.support.metrics import metric_value, scrape, value
from tests.support.redis_server import shared_redis_url

KEYS = [f"sk-worker-test-{i:02d}" for i in range(16)]
SHARE = 2
"""Sequences one key may have in flight (MAX_SEQUENCES_PER_KEY)."""
CHAT = "/v1/chat/completions"
SHORT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
LONG = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 1500,
    "ignore_eos": True,
    "stream": True,
}
LOG_LINE = re.compile(r" sluicegate\.access: .* status=(\d+) request_id=(\w+)")


def _spec(folder: Path, name: str) -> GatewaySpec:
    keys = folder / f"{name}-keys"
    keys.write_text("\n".join(KEYS) + "\n")
    return GatewaySpec(
        flags=("--workers", "2"),
        env={
            "SLUICEGATE_API_KEYS": f"@{keys}",
            "SLUICEGATE_MAX_SEQUENCES_PER_KEY": str(SHARE),
            "SLUICEGATE_REDIS_URL": shared_redis_url(),
            "SLUICEGATE_REDIS_KEY_PREFIX": f"workers-{name}",
            "SLUICEGATE_CACHE_POLICY": "off",
            # The drain test holds connections it opened before its streams started.
            "SLUICEGATE_KEEP_ALIVE_TIMEOUT": "300",
        },
    )


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Two gateways of two workers each, started together: one to serve, drain and stop; one
    whose engine core is killed."""
    folder = tmp_path_factory.mktemp("workers")
    with running_gateways(folder, _spec(folder, "serving"), _spec(folder, "dying")) as started:
        yield started


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _worker(response: httpx.Response) -> int:
    return int(response.headers["x-sluicegate-worker"])


def _statuses(gateway: GatewayProcess, request_ids: list[str]) -> list[int]:
    """The logged status of each request (a worker's log thread writes its access line just
    after the response; pytest's timeout bounds a line that never comes)."""
    while True:
        found = {m.group(2): int(m.group(1)) for m in LOG_LINE.finditer(gateway.log())}
        if all(request_id in found for request_id in request_ids):
            return [found[request_id] for request_id in request_ids]
        time.sleep(0.1)


def _until_both(
    send: Callable[[int], httpx.Response], each: int, most: int = 64
) -> list[httpx.Response]:
    """Requests, one after another on new connections, until each worker has answered `each`
    (the kernel picks a worker for each new connection by a hash of its port)."""
    responses: list[httpx.Response] = []
    while min(sum(_worker(r) == w for r in responses) for w in (0, 1)) < each:
        assert len(responses) < most, "one worker took every connection"
        responses.append(send(len(responses)))
    return responses


def _connections_to_both(url: str, each: int, most: int = 64) -> dict[int, list[httpx.Client]]:
    """`each` clients for each worker, each holding a kept-alive connection to it (opened, one
    after another, until each worker has answered `each` of them)."""
    pinned: dict[int, list[httpx.Client]] = {0: [], 1: []}
    for _ in range(most):
        client = httpx.Client(base_url=url, timeout=120)
        held = pinned[_worker(client.get("/health"))]
        if len(held) < each:
            held.append(client)
        else:
            client.close()
        if all(len(held) == each for held in pinned.values()):
            return pinned
    for client in (c for held in pinned.values() for c in held):
        client.close()
    raise AssertionError("one worker took every connection")


class Stream:
    """A long stream held open on a connection of its own, read in a thread."""

    def __init__(
        self, url: str, key: str, max_tokens: int = 1500, client: httpx.Client | None = None
    ) -> None:
        """On a connection of its own, or on `client`'s (which it closes when done)."""
        self.events: list[str] = []
        self.worker = -1
        self.request_id = ""
        self._stop = threading.Event()
        started = threading.Event()
        body = {**LONG, "max_tokens": max_tokens}

        def read() -> None:
            http = client if client is not None else httpx.Client(timeout=120)
            with (
                contextlib.closing(http),
                http.stream("POST", url + CHAT, json=body, headers=_headers(key)) as r,
            ):
                self.worker, self.request_id = _worker(r), r.headers["x-request-id"]
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        started.set()
                    if self._stop.is_set():
                        return  # leaving closes the connection: a disconnect
            started.set()

        self._started = started
        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()

    def wait_started(self) -> Stream:
        assert self._started.wait(120), "the stream did not start"
        return self

    def cut(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def finish(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive()


def _streams_on_both(url: str, keys: list[str], each: int, max_tokens: int = 1500) -> list[Stream]:
    """Streams, one key each, opened until each worker holds `each` of them. They are opened
    a batch at a time, together, so that the first does not end (short streams) while the
    last is still being placed."""
    streams: list[Stream] = []
    while (missing := sum(max(0, each - sum(s.worker == w for s in streams)) for w in (0, 1))) > 0:
        batch = keys[len(streams) : len(streams) + 2 * missing]
        assert batch, "one worker took every connection"
        opened = [Stream(url, key, max_tokens) for key in batch]
        streams += [stream.wait_started() for stream in opened]
    return streams


def test_both_workers_answer_and_one_scrape_counts_both(gateways: list[GatewayProcess]) -> None:
    gateway = gateways[0]
    before = scrape(gateway.url)
    responses = _until_both(
        lambda i: httpx.post(
            gateway.url + CHAT, json=SHORT, headers=_headers(KEYS[i % len(KEYS)]), timeout=120
        ),
        each=3,
    )
    assert {r.status_code for r in responses} == {200}
    after = scrape(gateway.url)
    labels = {"endpoint": CHAT, "model": MODEL_NAME, "status": "200"}
    counted = value(after, "sluicegate_requests_total", **labels)
    assert counted - value(before, "sluicegate_requests_total", **labels) == len(responses)
    # The engine's own series come once, whichever worker recorded them.
    engine = {"engine": "0", "model_name": MODEL_NAME}
    assert [n for n, _ in after if n == "vllm:num_requests_running"] == [
        "vllm:num_requests_running"
    ]
    finished = "vllm:request_success_total"
    done = value(after, finished, finished_reason="length", **engine)
    assert done - value(before, finished, finished_reason="length", **engine) == len(responses)


def test_a_keys_share_holds_across_the_workers(gateways: list[GatewayProcess]) -> None:
    """The key holds its two sequences (wherever they run); every request more it makes, on new
    connections, is refused, by both workers."""
    gateway = gateways[0]
    key = KEYS[0]
    held = [Stream(gateway.url, key).wait_started() for _ in range(SHARE)]
    try:
        refused = _until_both(
            lambda i: httpx.post(gateway.url + CHAT, json=SHORT, headers=_headers(key), timeout=60),
            each=3,
        )
        assert {r.status_code for r in refused} == {429}
        assert {r.json()["error"]["code"] for r in refused} == {"concurrency_limit_exceeded"}
    finally:
        for stream in held:
            stream.cut()


def test_disconnects_on_either_worker_abort_in_the_engine(gateways: list[GatewayProcess]) -> None:
    gateway = gateways[0]
    engine = {"engine": "0", "model_name": MODEL_NAME}
    streams = _streams_on_both(gateway.url, KEYS[2:], each=2)
    assert metric_value(gateway.url, "vllm:num_requests_running", **engine) == len(streams)
    for stream in streams:
        stream.cut()
    while metric_value(gateway.url, "vllm:num_requests_running", **engine):
        time.sleep(0.2)  # pytest's timeout bounds an abort that never reaches the engine
    assert set(_statuses(gateway, [s.request_id for s in streams])) == {499}


def test_sigterm_drains_streams_on_both_workers_then_everything_exits(
    gateways: list[GatewayProcess],
) -> None:
    gateway = gateways[0]
    family = psutil.Process(gateway.process.pid).children(recursive=True)
    assert len(family) >= 3  # two workers, the engine core (and its worker)
    # Connections held on each worker: two for streams (started together, so that none has
    # ended before the signal), one to probe. New connections go where the kernel hashes them:
    # probing through them raced the drain, which ends (the worker's socket closes) with the
    # worker's streams, and streams placed in several batches ended at different times.
    pinned = _connections_to_both(gateway.url, each=3)
    opened = [
        Stream(gateway.url, KEYS[2 * index + i], max_tokens=150, client=pinned[index][i])
        for index in (0, 1)
        for i in (0, 1)
    ]
    streams = [stream.wait_started() for stream in opened]
    assert [stream.worker for stream in streams] == [0, 0, 1, 1]
    probes = {index: clients[2] for index, clients in pinned.items()}
    try:
        gateway.process.send_signal(signal.SIGTERM)
        # The supervisor passes the signal on: both workers turn unready, and refuse new work.
        for index, client in probes.items():
            while (probe := client.get("/ready")).status_code != 503:
                assert probe.status_code == 200
            assert _worker(probe) == index
            refused = client.post(CHAT, json=SHORT, headers=_headers(KEYS[-1]))
            assert _worker(refused) == index
            assert (refused.status_code, refused.json()["error"]["code"]) == (503, "shutting_down")
    finally:
        for client in probes.values():
            client.close()
    for stream in streams:
        stream.finish()
        assert stream.events[-1] == "[DONE]"
        assert json.loads(stream.events[-2])["choices"][0]["finish_reason"] == "length"
    assert gateway.process.wait(60) == 0
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running: {alive}"


def test_an_engine_core_death_ends_both_workers_with_code_3(gateways: list[GatewayProcess]) -> None:
    gateway = gateways[1]
    streams = _streams_on_both(gateway.url, KEYS, each=2)
    cores = [
        p
        for p in psutil.Process(gateway.process.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline())
    ]
    assert len(cores) == 1
    cores[0].kill()
    for stream in streams:
        stream.finish()
        assert stream.events[-1] == "[DONE]"
        assert json.loads(stream.events[-2])["error"]["code"] == "engine_unavailable"
    assert gateway.process.wait(60) == ENGINE_DEATH_EXIT_CODE
    log = gateway.log()
    assert "engine core" in log and "died" in log
    for index in (0, 1):
        assert f"worker-{index} sluicegate.server: exiting with code 3" in log
