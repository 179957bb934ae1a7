"""Request limits, admission and timeouts, with the fake engine or a stub app."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from sluicegate.counters import SharedTally
from sluicegate.http.admission import AdmissionMiddleware
from sluicegate.http.body_limits import BodyLimitMiddleware
from sluicegate.http.errors import install_error_handlers
from sluicegate.lifecycle import Lifecycle
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread
from tests.support.sse import sse_data

MODEL = FAKE_MODEL


def client_for(engine: FakeEngine, **settings: object) -> TestClient:
    return TestClient(fake_app(engine, **settings))


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


# ---- body size and read time ---------------------------------------------------------


def echo_app(max_bytes: int = 100, read_timeout: float = 5.0) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(body: dict[str, object]) -> dict[str, object]:
        return body

    app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes, read_timeout=read_timeout)
    return app


def test_declared_oversize_body_is_a_413() -> None:
    with TestClient(echo_app()) as client:
        response = client.post("/echo", json={"x": "y" * 200})
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert client.post("/echo", json={"x": "small"}).json() == {"x": "small"}


async def test_chunked_oversize_body_is_a_413() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"x": "'
        for _ in range(10):
            yield b"y" * 30
        yield b'"}'

    transport = httpx.ASGITransport(app=echo_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/echo", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_a_body_that_never_finishes_is_a_408() -> None:
    app = echo_app(read_timeout=0.2)
    sent: list[Message] = []
    messages = [{"type": "http.request", "body": b'{"x": ', "more_body": True}]

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http", "method": "POST", "path": "/echo", "headers": [], "query_string": b"",
        "http_version": "1.1", "scheme": "http", "server": ("t", 80), "root_path": "",
    }  # fmt: skip
    started = time.monotonic()
    await app(scope, receive, send)
    # Cut at the 0.2 s read timeout, not when the body's 30 s wait ends.
    took = time.monotonic() - started
    assert took < 10, f"a body that never finishes was answered after {took:.2f} s"
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"


# ---- admission -----------------------------------------------------------------------


class Gate:
    """A stub app whose requests stay in flight until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def until_entered(self, count: int) -> None:
        """Until `count` requests are in (held), whatever the machine's load."""
        deadline = time.monotonic() + 10
        while self.entered < count:
            assert time.monotonic() < deadline, f"{self.entered} of {count} requests entered"
            await asyncio.sleep(0.001)


async def call(
    app: AdmissionMiddleware, path: str = "/v1/chat/completions", key: str | None = None
) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "path": path, "headers": [], "state": {}}
    if key is not None:
        scope["state"]["api_key_id"] = key
    await app(scope, receive, send)
    return sent


async def test_requests_beyond_the_bound_get_a_fast_503_and_slots_come_back() -> None:
    gate = Gate()
    admission = AdmissionMiddleware(gate, Lifecycle(5), max_in_flight=2, max_in_flight_per_key=None)
    held = [asyncio.create_task(call(admission)) for _ in range(2)]
    await gate.until_entered(2)
    # Fast: answered while both held requests still wait on the gate, so the refusal waited
    # on neither of them (the bound only catches a hang; how fast is `bench/latency_probes.py`).
    refused = await asyncio.wait_for(call(admission), timeout=10)
    assert not any(task.done() for task in held), "the refusal waited for a held request"
    assert refused[0]["status"] == 503
    assert (b"retry-after", b"1") in refused[0]["headers"]
    assert json.loads(refused[1]["body"])["error"]["code"] == "overloaded"
    gate.release.set()
    await asyncio.gather(*held)
    assert admission.lifecycle.in_flight == 0
    assert (await call(admission))[0]["status"] == 200


async def test_other_paths_are_not_counted() -> None:
    gate = Gate()
    gate.release.set()
    admission = AdmissionMiddleware(gate, Lifecycle(5), max_in_flight=1, max_in_flight_per_key=None)
    admission.lifecycle.in_flight = 1
    assert (await call(admission, path="/health"))[0]["status"] == 200


async def test_one_key_cannot_hold_more_than_its_share() -> None:
    gate = Gate()
    admission = AdmissionMiddleware(gate, Lifecycle(5), max_in_flight=10, max_in_flight_per_key=1)
    held = asyncio.create_task(call(admission, key="key-a"))
    await gate.until_entered(1)
    refused = await call(admission, key="key-a")
    assert refused[0]["status"] == 429
    assert json.loads(refused[1]["body"])["error"]["code"] == "concurrency_limit_exceeded"
    other = asyncio.create_task(call(admission, key="key-b"))
    await gate.until_entered(2)
    gate.release.set()
    await asyncio.gather(held, other)
    assert [admission.tally.count(k) for k in ("req", "req:key-a", "req:key-b")] == [0, 0, 0]


async def test_workers_sharing_a_tally_hold_one_bound_between_them() -> None:
    """Two workers' admission (two middlewares) over one shared tally: the gateway's bound and
    a key's share are each one, not one per worker."""
    tally = SharedTally(keys=16)
    gate = Gate()
    workers = [
        AdmissionMiddleware(gate, Lifecycle(5), 2, max_in_flight_per_key=1, tally=tally)
        for _ in range(2)
    ]
    held = asyncio.create_task(call(workers[0], key="key-a"))
    await gate.until_entered(1)
    refused = await call(workers[1], key="key-a")
    assert refused[0]["status"] == 429  # key-a's one slot is held in the other worker
    other = asyncio.create_task(call(workers[1], key="key-b"))
    await gate.until_entered(2)
    full = await call(workers[0], key="key-c")
    assert full[0]["status"] == 503  # two in flight, across the workers
    assert json.loads(full[1]["body"])["error"]["code"] == "overloaded"
    gate.release.set()
    await asyncio.gather(held, other)
    assert [tally.count(k) for k in ("req", "req:key-a", "req:key-b")] == [0, 0, 0]


async def test_while_draining_new_requests_get_503_and_in_flight_ones_finish() -> None:
    gate = Gate()
    lifecycle = Lifecycle(drain_timeout=30)
    admission = AdmissionMiddleware(gate, lifecycle, max_in_flight=10, max_in_flight_per_key=None)
    held = asyncio.create_task(call(admission))
    await gate.until_entered(1)
    lifecycle.begin_drain()
    assert not lifecycle.drained()
    refused = await call(admission)
    assert refused[0]["status"] == 503
    assert json.loads(refused[1]["body"])["error"]["code"] == "shutting_down"
    gate.release.set()
    assert (await held)[0]["status"] == 200
    assert lifecycle.drained()


def test_a_slow_body_holds_no_slot_until_it_has_arrived() -> None:
    lifecycle = Lifecycle(drain_timeout=5)
    app = fake_app(FakeEngine(), lifecycle=lifecycle, max_in_flight=1)
    body = json.dumps(chat()).encode()
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as slow:
            slow.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body[:10])
            )
            time.sleep(0.2)
            assert lifecycle.in_flight == 0
            # The one slot is free for a request whose body has come.
            assert httpx.post(f"{url}/v1/chat/completions", json=chat()).status_code == 200
            slow.sendall(body[10:])
            slow.settimeout(10)
            assert b" 200 " in slow.recv(65536).split(b"\r\n", 1)[0]
        deadline = time.monotonic() + 5
        while lifecycle.in_flight:  # the slot is given back just after the last byte
            assert time.monotonic() < deadline, "the slot was not given back"
            time.sleep(0.01)


async def test_a_client_that_leaves_mid_body_reaches_no_route() -> None:
    reached: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope)

    messages: list[Message] = [
        {"type": "http.request", "body": b'{"x": ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    limits = BodyLimitMiddleware(app, max_bytes=100, read_timeout=5)
    await limits({"type": "http", "headers": []}, receive, send)
    assert reached == []
    assert sent[0]["status"] == 499  # for the access log and metrics; nobody reads it


async def test_the_app_below_gets_the_body_in_one_message() -> None:
    bodies: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        bodies.append(await receive())

    chunks: list[Message] = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]

    async def receive() -> Message:
        return chunks.pop(0)

    async def send(message: Message) -> None:
        raise AssertionError(message)

    await BodyLimitMiddleware(app, max_bytes=100, read_timeout=5)(
        {"type": "http", "headers": []}, receive, send
    )
    assert bodies == [{"type": "http.request", "body": b"abcd", "more_body": False}]


def test_drain_ends_when_its_time_is_up() -> None:
    lifecycle = Lifecycle(drain_timeout=0)
    lifecycle.in_flight = 3
    assert not lifecycle.drained()
    lifecycle.begin_drain()
    assert lifecycle.drained()


def test_ready_turns_503_while_draining() -> None:
    lifecycle = Lifecycle(drain_timeout=30)
    with TestClient(fake_app(lifecycle=lifecycle)) as client:
        assert client.get("/ready").status_code == 200
        lifecycle.begin_drain()
        response = client.get("/ready")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "shutting_down"
        assert client.get("/health").status_code == 200


# ---- per-request limits --------------------------------------------------------------


@pytest.fixture
def limited() -> Iterator[TestClient]:
    with client_for(FakeEngine(), max_messages=2, max_n=2, max_tokens_limit=5, max_prompts=2) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "x"}] * 3), "messages"),
        ("/v1/chat/completions", chat(n=3, temperature=1), "n"),
        ("/v1/chat/completions", chat(max_tokens=6), "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b", "c"]}, "prompt"),
    ],
)
def test_each_limit_is_a_400_naming_its_parameter(
    limited: TestClient, path: str, body: dict[str, object], param: str
) -> None:
    response = limited.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


# ---- timeouts ------------------------------------------------------------------------


def test_a_request_over_its_time_limit_is_a_504_and_the_work_stops() -> None:
    engine = FakeEngine(step_delay=30)
    with client_for(engine, request_timeout=0.3) as client:
        started = time.monotonic()
        response = client.post("/v1/chat/completions", json=chat())
        # Cut at the 0.3 s limit, not when the engine's 30 s step ends.
        took = time.monotonic() - started
        assert took < 10, f"a request over its 0.3 s limit was answered after {took:.2f} s"
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "timeout"
        stream = client.post("/v1/chat/completions", json=chat(stream=True))
        assert stream.status_code == 504
    assert engine.active == set()


def test_a_stalled_stream_ends_with_an_error_event_and_the_work_stops() -> None:
    engine = FakeEngine(delays=[0, 5])
    with client_for(engine, stream_stall_timeout=0.3) as client:
        response = client.post("/v1/chat/completions", json=chat(stream=True))
        assert response.status_code == 200
        events = sse_data(response.text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "timeout"
        assert json.loads(events[1])["choices"][0]["delta"]["content"] == "Hello"
    assert engine.active == set()
