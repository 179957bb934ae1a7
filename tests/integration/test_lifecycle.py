"""Engine death and graceful shutdown, each on a gateway of its own (started together with the
others of its kind, so their start-ups overlap)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from sluicegate.lifecycle import ENGINE_DEATH_EXIT_CODE
from tests.support.gateway import MODEL_NAME, GatewayProcess, GatewaySpec, running_gateways
from tests.support.metrics import metric_value

STREAM_BODY = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 48,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def dying(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """For the engine-death tests: the default, and one told to stay up, bound to every
    interface with no API keys as the images run by default."""
    stays_up = GatewaySpec(
        flags=("--host", "0.0.0.0"), env={"SLUICEGATE_EXIT_ON_ENGINE_DEATH": "false"}
    )
    with running_gateways(tmp_path_factory.mktemp("dying"), GatewaySpec(), stays_up) as started:
        yield started


@pytest.fixture(scope="module")
def draining(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """For the shutdown tests: a drain of 2 s, and one of 60 s."""
    short, long = (GatewaySpec(flags=("--shutdown-timeout", str(s))) for s in (2, 60))
    folder = tmp_path_factory.mktemp("draining")
    with running_gateways(folder, short, long) as started:
        yield started


def kill_engine_core(gateway: GatewayProcess) -> None:
    children = psutil.Process(gateway.process.pid).children(recursive=True)
    assert children, "the engine core runs in a child process"
    for child in children:
        child.kill()


def test_engine_death_answers_what_is_in_flight_with_503_then_exits_3(
    dying: list[GatewayProcess],
) -> None:
    gateway = dying[0]
    url = f"{gateway.url}/v1/chat/completions"
    long = {**STREAM_BODY, "max_tokens": 1500, "stream": False}
    replies: dict[str, httpx.Response] = {}
    events: list[str] = []

    def plain() -> None:
        replies["plain"] = httpx.post(url, json=long, timeout=120)

    def stream() -> None:
        with httpx.stream("POST", url, json={**long, "stream": True}, timeout=120) as response:
            replies["stream"] = response
            events.extend(
                line.removeprefix("data: ")
                for line in response.iter_lines()
                if line.startswith("data: ")
            )

    clients = [threading.Thread(target=plain), threading.Thread(target=stream)]
    try:
        for client in clients:
            client.start()
        deadline = time.monotonic() + 60
        while metric_value(gateway.url, "vllm:num_requests_running") < 2:
            assert time.monotonic() < deadline, "the two requests did not start"
            time.sleep(0.1)
        killed = time.monotonic()
        kill_engine_core(gateway)
        for client in clients:
            client.join(60)
            assert not client.is_alive()
        # What was in flight ends with the engine's error, not a hang.
        assert replies["plain"].status_code == 503
        assert replies["plain"].json()["error"]["code"] == "engine_unavailable"
        assert replies["stream"].status_code == 200
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "engine_unavailable"
        # Then the process exits non-zero, so its supervisor restarts it.
        assert gateway.process.wait(60) == ENGINE_DEATH_EXIT_CODE
        print(f"engine core killed: gateway exited 3 after {time.monotonic() - killed:.1f} s")
        log = gateway.log()
        assert "the inference engine died" in log and "exiting with code 3" in log
    finally:
        gateway.stop()


def test_with_exit_on_engine_death_off_the_gateway_stays_up_answering_503(
    dying: list[GatewayProcess],
) -> None:
    gateway = dying[1]
    try:
        warning = [line for line in gateway.log().splitlines() if "reachable from" in line]
        assert warning and "WARNING" in warning[0] and "SLUICEGATE_API_KEYS" in warning[0]

        kill_engine_core(gateway)
        deadline = time.monotonic() + 30
        while httpx.get(f"{gateway.url}/ready", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/ready still 200 after the engine died"
            time.sleep(0.2)
        ready = httpx.get(f"{gateway.url}/ready", timeout=5).json()
        assert ready["error"]["code"] == "engine_unavailable"
        assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200

        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
        for body in (chat, {**chat, "stream": True}):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "engine_unavailable"
        completion = {"model": MODEL_NAME, "prompt": "hi"}
        response = httpx.post(f"{gateway.url}/v1/completions", json=completion, timeout=10)
        assert response.status_code == 503
        assert metric_value(gateway.url, "sluicegate_engine_unavailable_total") == 3
        time.sleep(3)  # well past the watcher's interval, were it running
        assert gateway.process.poll() is None, "the gateway exited though told to stay up"
        assert httpx.get(f"{gateway.url}/ready", timeout=5).status_code == 503
    finally:
        gateway.stop()


def test_drain_timeout_cuts_long_streams_and_still_exits_cleanly(
    draining: list[GatewayProcess],
) -> None:
    gateway = draining[0]
    long_stream = {**STREAM_BODY, "max_tokens": 1500}
    started = threading.Event()
    ended = threading.Event()

    def consume() -> None:
        try:
            with httpx.stream(
                "POST", f"{gateway.url}/v1/chat/completions", json=long_stream, timeout=120
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        started.set()
        except httpx.HTTPError:
            pass  # the server closes the connection mid-stream: expected
        ended.set()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        assert started.wait(60)
        signalled = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        assert gateway.process.wait(30) == 0
        assert time.monotonic() - signalled < 15
        assert ended.wait(10), "the client saw its stream end"
    finally:
        gateway.stop()


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def in_session(session: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(process.pid) == session:
                members.append(process)
    return members


def test_sigterm_to_the_whole_process_group_drains_20_live_streams_and_leaves_no_process(
    draining: list[GatewayProcess],
) -> None:
    """What systemd's default KillMode and `kill -- -PID` do: the signal reaches every process
    of the gateway's group (it leads its own session here), the engine's included. While it
    drains, the gateway still answers: not ready, and no new work; every stream ends whole.
    (SIGTERM to the gateway's process alone is `test_parallel_engine.py`'s and
    `test_entrypoint.py`'s.)"""
    gateway = draining[1]
    pid = gateway.process.pid
    # A body past `LARGE_BODY_BYTES` starts the parse worker, a process of the group too.
    large = {"model": MODEL_NAME, "prompt": "word " * 30_000}
    httpx.post(f"{gateway.url}/tokenize", json=large, timeout=60)
    children = psutil.Process(pid).children(recursive=True)
    assert len(children) >= 3, "engine core, its worker and the parse worker"
    # Long enough that the streams outlast the checks made while they drain, on a busy
    # machine too (at 48 tokens they had all ended, and the server exited, before the check
    # of a refused request).
    body = {**STREAM_BODY, "max_tokens": 192}
    streams: list[list[str]] = [[] for _ in range(20)]
    started = [threading.Event() for _ in streams]

    def consume(i: int) -> None:
        with httpx.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=180
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    streams[i].append(line.removeprefix("data: "))
                    started[i].set()

    readers = [threading.Thread(target=consume, args=(i,)) for i in range(len(streams))]
    for reader in readers:
        reader.start()
    try:
        for event in started:
            assert event.wait(120), "a stream did not start"
        os.killpg(pid, signal.SIGTERM)
        signalled = time.monotonic()
        # Safety, not speed: a balancer that still sees "ready" keeps sending work to a gateway
        # that refuses it. It turns at once (the first probe, alone); 10 s is far past that.
        while httpx.get(f"{gateway.url}/ready", timeout=5).status_code != 503:
            waited = time.monotonic() - signalled
            drain = [line for line in gateway.log().splitlines() if "draining:" in line]
            assert waited < 10, f"/ready still 200 {waited:.1f} s after SIGTERM; drain log: {drain}"
            time.sleep(0.05)
        refused = httpx.post(f"{gateway.url}/v1/chat/completions", json={**body, "stream": False})
        serving = running(children)
        assert any(reader.is_alive() for reader in readers), "the drain was still under way"
        # So every process the drain needs was still serving when looked at.
        assert serving == children, "a child process died of the signal"
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["retry-after"] == "1"
        for reader in readers:
            reader.join(180)
            assert not reader.is_alive()
        for events in streams:
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            assert text, "every stream carried its content"
        assert gateway.process.wait(60) == 0
        # Then nothing is left: no child of the gateway, nothing of its session.
        deadline = time.monotonic() + 30
        while left := running(children) + running(in_session(pid)):
            assert time.monotonic() < deadline, f"still running after 30 s: {left}"
            time.sleep(0.2)
    finally:
        gateway.stop()
        for process in running(children):
            process.kill()
