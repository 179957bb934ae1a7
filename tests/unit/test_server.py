"""The server as `sluicegate serve` runs it (uvicorn, its limits, the connection guard, the
drain), over the fake engine, on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sluicegate.lifecycle import ENGINE_DEATH_EXIT_CODE, Lifecycle
from sluicegate.ports import bind_socket
from sluicegate.server import (
    DrainingServer,
    exposure_warning,
    server_config,
    worker_socket,
)
from sluicegate.settings import Settings
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, loopback_socket, run_in_thread
from tests.support.gateway import free_port, gateway_env
from tests.support.metrics import local_value


@dataclass
class Running:
    port: int
    engine: FakeEngine
    lifecycle: Lifecycle
    thread: threading.Thread
    server: DrainingServer

    def until_connections(self, count: int, within: float = 10.0) -> None:
        """Wait until the server has accepted `count` connections (uvicorn's own set)."""
        deadline = time.monotonic() + within
        while (accepted := len(self.server.server_state.connections)) < count:
            assert time.monotonic() < deadline, f"{accepted} of {count} connections accepted"
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self, receive_buffer: int | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.connect(("127.0.0.1", self.port))
        return sock


@contextlib.contextmanager
def running(engine: FakeEngine | None = None, **settings: object) -> Iterator[Running]:
    engine = engine or FakeEngine()
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = Settings(served_model_name=FAKE_MODEL, port=port, _env_file=None, **settings)  # type: ignore[call-arg]
    lifecycle = Lifecycle(drain_timeout=config.shutdown_timeout)
    server = DrainingServer(
        server_config(config, fake_app(engine, lifecycle=lifecycle, **settings)), lifecycle
    )
    with run_in_thread(server, sock) as thread:
        yield Running(port, engine, lifecycle, thread, server)


def read_until_closed(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (an
    assertion error if it still holds the connection open after `within` seconds)."""
    started = time.monotonic()
    sock.settimeout(within)
    received = b""
    try:
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    except TimeoutError:
        raise AssertionError(
            f"the server still held the connection open after {within:g} s: {received[:200]!r}"
        ) from None
    return received, time.monotonic() - started


CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}


# ---- the request head ----------------------------------------------------------------------


def test_a_request_head_that_trickles_in_gets_a_408_and_the_connection_closes() -> None:
    with running(request_head_timeout=0.5) as server:
        opened = time.monotonic()  # the head timer starts once the connection is accepted
        with server.connect() as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n")
            # A byte every 0.1 s for up to 20 s, until the server answers: were the trickle
            # to keep the head open, it would go on for all of it.
            trickled_until = time.monotonic() + 20
            while not select.select([sock], [], [], 0.1)[0]:
                assert time.monotonic() < trickled_until, (
                    "a head trickling in a byte every 0.1 s was kept open 20 s, 40 times "
                    "its 0.5 s limit"
                )
                sock.sendall(b"x")
            answer, _ = read_until_closed(sock, within=10)
            closed_after = time.monotonic() - opened
    # Not before the limit: it counts from the connection, not from the last byte.
    assert closed_after > 0.45, f"the head was cut after {closed_after:.2f} s, under its 0.5 s"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_connection_that_sends_nothing_is_closed_without_an_answer() -> None:
    with running(request_head_timeout=0.5) as server:
        opened = time.monotonic()
        with server.connect() as sock:
            # Closed after the 0.5 s limit; one held for good is what the 10 s catch.
            answer, _ = read_until_closed(sock, within=10)
            closed_after = time.monotonic() - opened
    assert answer == b""
    assert closed_after > 0.45, f"closed after {closed_after:.2f} s, under the 0.5 s limit"


def test_the_head_limit_leaves_kept_alive_connections_and_slow_engines_alone() -> None:
    engine = FakeEngine(step_delay=0.3)  # the answer takes longer than the head limit
    with (
        running(engine, request_head_timeout=0.5) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        for _ in range(2):
            time.sleep(0.3)
            response = client.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 200


# ---- connections and keep-alive ------------------------------------------------------------


def ask(
    sock: socket.socket, method: str, path: str, body: object = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on `sock`: the status, headers and body of its answer."""
    payload = b"" if body is None else json.dumps(body).encode()
    sock.sendall(
        b"%s %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (method.encode(), path.encode(), len(payload), payload)
    )
    sock.settimeout(10)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(rest) < int(headers["content-length"]):
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def test_connections_past_max_connections_are_refused_in_our_envelope_the_first_served() -> None:
    refused_before = refused_connections()
    with running(max_connections=3, request_head_timeout=30) as server:
        first = [server.connect() for _ in range(3)]
        server.until_connections(3)  # all three accepted: every slot is taken
        with server.connect() as extra:
            status, headers, body = ask(extra, "POST", "/v1/chat/completions", CHAT)
            assert status == 503
            assert json.loads(body)["error"]["code"] == "overloaded"
            assert headers["retry-after"] == "1"
            assert headers["connection"] == "close"
            assert read_until_closed(extra, within=5)[0] == b""
        with server.connect() as probe:  # probes are answered on any connection
            assert ask(probe, "GET", "/health")[0] == 200
        closes = []
        for sock in first:  # the connections accepted first are served
            status, headers, body = ask(sock, "POST", "/v1/chat/completions", CHAT)
            assert status == 200, body
            closes.append(headers.get("connection") == "close")
            sock.close()
        # The first closes after its answer: every slot was taken, and others wait for one.
        assert closes[0]
        time.sleep(0.2)
        assert httpx.get(f"{server.url}/health").status_code == 200
    assert refused_connections() == refused_before + 1


def refused_connections() -> float:
    return local_value("sluicegate_admission_refused_total", reason="connections")


def test_a_slot_freed_before_its_request_goes_to_a_connection_accepted_past_the_limit() -> None:
    with running(max_connections=2, request_head_timeout=30) as server:
        first = [server.connect() for _ in range(2)]
        with server.connect() as late:
            server.until_connections(3)  # the late one accepted, past the limit
            first.pop().close()
            slots = server.server.config.http_protocol_class.slots
            deadline = time.monotonic() + 10
            while slots.taken > 1:  # the close seen, and its slot given back
                assert time.monotonic() < deadline, "the closed connection still holds its slot"
                time.sleep(0.01)
            status, _, body = ask(late, "POST", "/v1/chat/completions", CHAT)
            assert status == 200, body
        for sock in first:
            sock.close()


def test_an_idle_kept_alive_connection_closes_after_keep_alive_timeout() -> None:
    with running(keep_alive_timeout=1) as server, server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
        # Closed after the 1 s keep-alive timeout; one kept open for good is what the 10 s
        # catch (the timer starts once the answer is sent, after `read_until_closed` began).
        answer, closed_after = read_until_closed(sock, within=10)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert closed_after > 0.8, f"closed after {closed_after:.2f} s, under the 1 s keep-alive"


# ---- a client that stops reading -----------------------------------------------------------


def test_a_stream_whose_client_stops_reading_is_dropped_and_its_work_aborted() -> None:
    # 2 KB events without end: the socket buffers fill within a moment.
    engine = FakeEngine(words=["x" * 2048] * 100_000, max_model_len=200_000)
    with running(engine, stream_stall_timeout=0.5) as server:
        sock = server.connect(receive_buffer=4096)
        body = json.dumps({**CHAT, "stream": True, "max_tokens": 100_000}).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert b" 200 " in sock.recv(4096).split(b"\r\n", 1)[0]
        stopped = time.monotonic()  # no more reading
        # 0.65 s alone (the buffers fill, then the 0.5 s stall timeout); without the timeout
        # the 200 MB stream would hold it for good. The bound is over 5 times what it takes
        # with both cores busy.
        while engine.active or server.lifecycle.in_flight:
            assert time.monotonic() - stopped < 15, (
                f"the stalled stream still holds its slot {time.monotonic() - stopped:.1f} s "
                f"after the last read: {len(engine.active)} engine requests active, "
                f"{server.lifecycle.in_flight} in flight"
            )
            time.sleep(0.05)
        released = time.monotonic() - stopped
        # Then the client finds its connection gone (after what was buffered for it).
        _, _ = read_until_closed(sock, within=5)
        sock.close()
    print(f"stalled stream released after {released:.2f} s (stall timeout 0.5 s)")


# ---- engine death --------------------------------------------------------------------------


def test_engine_death_drains_and_ends_the_server_with_exit_code_3() -> None:
    with running() as server:
        server.engine.healthy = False
        server.thread.join(10)
        assert not server.thread.is_alive(), "the server kept running on a dead engine"
    assert server.lifecycle.exit_code == ENGINE_DEATH_EXIT_CODE
    assert "engine died" in server.lifecycle.exit_reason


def test_with_exit_on_engine_death_off_the_server_stays_up_unready() -> None:
    with running(exit_on_engine_death=False) as server:
        server.engine.healthy = False
        time.sleep(2.5)
        assert server.thread.is_alive()
        response = httpx.get(f"{server.url}/ready")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_unavailable"
    assert server.lifecycle.exit_code == 0


# ---- a worker's start-up -------------------------------------------------------------------


def _accept_all(sock: socket.socket, within: float) -> int:
    """Connections `sock` accepts (and closes) until none comes for `within` seconds."""
    sock.settimeout(within)
    accepted = 0
    with contextlib.suppress(TimeoutError):
        while True:
            connection, _ = sock.accept()
            connection.close()
            accepted += 1
    return accepted


def test_a_worker_takes_no_connections_until_its_start_up_is_done() -> None:
    """With several workers on one port (SO_REUSEPORT), one still starting must leave every new
    connection to those that serve: listening early, it took its share and held them
    unanswered in its backlog for as long as its start-up lasted."""
    port = free_port()
    settings = Settings(host="127.0.0.1", port=port, _env_file=None)  # type: ignore[call-arg]
    starting, release, serving = threading.Event(), threading.Event(), threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            starting.set()
            await asyncio.to_thread(release.wait, 60)
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

    # The other worker: serving already.
    other = bind_socket("127.0.0.1", port, reuse_port=True)
    other.listen(128)
    lifecycle = Lifecycle(drain_timeout=1)
    server = DrainingServer(
        server_config(settings, app),  # type: ignore[arg-type]
        lifecycle,
        worker=True,
        on_serving=serving.set,
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [worker_socket(settings)]})
    thread.start()
    clients: list[socket.socket] = []
    try:
        assert starting.wait(20)
        clients += [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(32)]
        assert _accept_all(other, within=1.0) == 32
        release.set()
        assert serving.wait(20)
        clients += [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(32)]
        # Now the kernel spreads them over both (a hash of the client's port): the odds that
        # all 32 go to one are 2**-31.
        assert _accept_all(other, within=1.0) < 32
    finally:
        release.set()
        for client in clients:
            client.close()
        server.should_exit = True
        thread.join(10)
        other.close()


# ---- safe defaults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "keys", "warned"),
    [
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("10.1.2.3", None, True),
        ("gateway.internal", None, True),
        ("0.0.0.0", "secret-key-1234567", False),
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
    ],
)
def test_a_reachable_address_without_api_keys_is_warned_about(
    host: str, keys: str | None, warned: bool
) -> None:
    settings = Settings(host=host, api_keys=keys, _env_file=None)  # type: ignore[call-arg]
    warning = exposure_warning(settings)
    assert (warning is not None) == warned
    if warning is not None:
        assert host in warning and "SLUICEGATE_API_KEYS" in warning


# ---- the port --------------------------------------------------------------------------------


def _serve_on(port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    """`sluicegate serve` on `port` in upstream mode (an upstream that is not there: a
    gateway that got past the port would try it for 3 s, then fail for that)."""
    command = [
        sys.executable, "-m", "sluicegate", "serve", "--port", str(port),
        "--upstream-urls", "http://127.0.0.1:9/v1", "--upstream-start-timeout", "3", *flags,
    ]  # fmt: skip
    # The bound guards a hang only: the refusal comes before anything starts.
    return subprocess.run(command, capture_output=True, text=True, env=gateway_env(), timeout=120)


WORKERS = ("--workers", "2", "--redis-url", "redis://127.0.0.1:9/0")


@pytest.mark.parametrize(
    ("occupant", "flags", "says"),
    [
        ("server", (), "Address already in use"),
        ("workers", WORKERS, "Address already in use"),
        ("gateway", (), "another sluicegate gateway"),
        ("gateway", WORKERS, "another sluicegate gateway"),
    ],
    ids=["another-server", "a-gateways-workers", "a-gateway-starting", "workers-vs-gateway"],
)
def test_a_second_serve_on_a_port_in_use_fails_at_once_naming_it(
    occupant: str, flags: tuple[str, ...], says: str
) -> None:
    """Another server listening there; the listening sockets of a gateway's workers, which
    share the port with SO_REUSEPORT and would have let a second gateway's workers join them
    (each gateway silently getting part of the connections); a gateway still starting, not
    listening yet. Each time the second `serve` stops before anything starts."""
    port = free_port()
    held: list[Any] = []
    if occupant == "gateway":
        from sluicegate.ports import hold_port

        held.append(hold_port(Settings(port=port, _env_file=None)))  # type: ignore[call-arg]
    else:
        sock = bind_socket("127.0.0.1", port, reuse_port=occupant == "workers")
        sock.listen(8)
        held.append(sock)
    try:
        done = _serve_on(port, *flags)
    finally:
        for thing in held:
            thing.close()
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"127.0.0.1:{port}" in done.stderr or f"port {port}" in done.stderr
    assert says in done.stderr
    assert "upstream" not in done.stderr.lower(), "it went on past the port"


def test_a_gateways_port_is_free_again_once_it_is_let_go() -> None:
    from sluicegate.ports import PortError, hold_port

    port = free_port()
    settings = Settings(port=port, workers=2, redis_url="redis://r", _env_file=None)  # type: ignore[call-arg]
    first = hold_port(settings)
    with pytest.raises(PortError, match="another sluicegate gateway"):
        hold_port(settings)
    # Its workers join the port it holds, as they do (SO_REUSEPORT).
    worker = worker_socket(settings)
    worker.close()
    first.close()
    hold_port(settings).close()


def test_a_process_forked_from_a_gateway_does_not_keep_its_port_lock() -> None:
    """An engine core forked from the gateway would otherwise hold the lock on after the
    gateway ended, and its restart would find the port taken."""
    import multiprocessing

    from sluicegate.ports import hold_port

    settings = Settings(port=free_port(), _env_file=None)  # type: ignore[call-arg]
    held = hold_port(settings)
    context = multiprocessing.get_context("fork")
    running = context.Event()
    child = context.Process(target=_run_then_sleep, args=(running,))
    child.start()
    try:
        assert running.wait(30)
        held.close()
        hold_port(settings).close()
    finally:
        child.kill()
        child.join(10)


def _run_then_sleep(running: Any) -> None:
    running.set()
    time.sleep(60)
