"""Slow and hostile connections against the real engine, on a gateway of its own.

A stream whose client stops reading, a body that trickles in, a request head that never
completes: none may hold an admission slot, engine work or a connection past its time limit.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway
from tests.support.metrics import metric_value

# Also the longest the 16-choice stream may wait for its first event: 5 s, then 15 s, were
# outlasted on a loaded two-core machine (a 504 before the first byte; the other lane's engine
# and gateway on the same cores), so twice that.
STALL_TIMEOUT = 30.0
HEAD_TIMEOUT = 2.0
IN_FLIGHT = "sluicegate_requests_in_flight"
RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path_factory.mktemp("slow"),
        env={
            # One slot: any request that holds one shows at once.
            "SLUICEGATE_MAX_IN_FLIGHT": "1",
            "SLUICEGATE_STREAM_STALL_TIMEOUT": str(STALL_TIMEOUT),
            "SLUICEGATE_REQUEST_HEAD_TIMEOUT": str(HEAD_TIMEOUT),
        },
    ) as gateway:
        yield gateway


def raw_request(body: dict[str, object], length: int | None = None) -> tuple[bytes, bytes]:
    """The request head and the body, as a client would write them."""
    payload = json.dumps(body).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (len(payload) if length is None else length)
    )
    return head, payload


def connect(gateway: GatewayProcess, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        # Before connect, so the advertised window is small from the handshake on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", gateway.port))
    return sock


def wait_for(gateway: GatewayProcess, metric: str, value: float, within: float) -> float:
    """Seconds until `metric` reads `value`; fails after `within`."""
    started = time.monotonic()
    while (current := metric_value(gateway.url, metric)) != value:
        assert time.monotonic() - started < within, f"{metric} stayed at {current}"
        time.sleep(0.05)
    return time.monotonic() - started


def server_holds_connection(gateway: GatewayProcess, client: socket.socket) -> bool:
    port = client.getsockname()[1]
    connections = psutil.Process(gateway.process.pid).net_connections("tcp")
    return any(c.raddr and c.raddr.port == port for c in connections)


def small_chat_works(gateway: GatewayProcess) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def test_a_stream_whose_client_stops_reading_gives_back_its_slot_and_engine_work(
    slow: GatewayProcess,
) -> None:
    # The kernel buffers about 3 MB on a loopback connection before the server's writes
    # block: 16 choices with 20 alternatives per token fill that within seconds.
    choices, max_tokens = 16, 1900
    head, payload = raw_request(
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": max_tokens,
            "n": choices,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 20,
            "stream": True,
        }
    )
    small_chat_works(slow)  # warm: the first request after start-up is slower
    generated_before = metric_value(slow.url, GENERATED)
    sock = connect(slow, receive_buffer=4096)
    try:
        sock.sendall(head + payload)
        sock.settimeout(30)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096)
        assert b" 200 " in received.split(b"\r\n", 1)[0], received
        while b"data: " not in received:
            received += sock.recv(4096)
        stopped = time.monotonic()  # the client reads no more from here on
        assert metric_value(slow.url, RUNNING) >= 1

        # 29 s alone (the socket buffers fill at the engine's pace, then the stall timeout):
        # a deadline with room for a loaded machine, where it fills more slowly.
        slot_back = wait_for(slow, IN_FLIGHT, 0, within=180)
        engine_idle = slot_back + wait_for(slow, RUNNING, 0, within=5)
        generated = metric_value(slow.url, GENERATED) - generated_before
        print(
            f"client stopped reading: slot back after {slot_back:.1f} s, engine idle after "
            f"{engine_idle:.1f} s, {generated:.0f} of {choices * max_tokens} tokens generated "
            f"(stall timeout {STALL_TIMEOUT} s)"
        )
        assert generated < choices * max_tokens / 2, "the engine request ran on"
        small_chat_works(slow)  # the one slot is free again

        # And the connection itself is let go, though the client never closed it.
        deadline = time.monotonic() + 10
        while server_holds_connection(slow, sock):
            assert time.monotonic() < deadline, "the server still holds the stalled connection"
            time.sleep(0.1)
        print(f"connection dropped {time.monotonic() - stopped:.1f} s after the last read")
    finally:
        sock.close()


def test_a_slow_body_holds_no_admission_slot(slow: GatewayProcess) -> None:
    head, payload = raw_request(
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    )
    sock = connect(slow)
    try:
        sock.sendall(head + payload[:10])  # the rest never comes
        wait_for(slow, IN_FLIGHT, 1, within=10)  # its head is in: it is being read
        small_chat_works(slow)  # MAX_IN_FLIGHT=1: the slow body must not hold the slot
        assert metric_value(slow.url, IN_FLIGHT) == 1  # the slow body, not yet admitted
    finally:
        sock.close()


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"])
def test_a_request_head_that_does_not_complete_in_time_loses_its_connection(
    slow: GatewayProcess, sent: bytes
) -> None:
    sock = connect(slow)
    try:
        sock.sendall(sent)
        opened = time.monotonic()
        give_up = opened + HEAD_TIMEOUT + 10
        answer = b""
        # A trickle of header bytes does not keep the connection open.
        while chunk := _recv_or_trickle(sock, trickle=bool(sent), give_up=give_up):
            answer += chunk
        closed_after = time.monotonic() - opened
        print(f"head sent {len(sent)} bytes: connection closed after {closed_after:.2f} s")
        assert closed_after < HEAD_TIMEOUT + 1.5
        if sent:
            assert b" 408 " in answer.split(b"\r\n", 1)[0]
            error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert error["code"] == "request_timeout"
        else:
            assert answer == b""
    finally:
        sock.close()
    small_chat_works(slow)


def _recv_or_trickle(sock: socket.socket, trickle: bool, give_up: float) -> bytes:
    """The server's next bytes (b"" once it closed); with `trickle`, sends one more byte of
    a header name every 0.3 s meanwhile."""
    sock.settimeout(0.3)
    while True:
        assert time.monotonic() < give_up, "the server kept the connection open"
        try:
            return sock.recv(4096)
        except TimeoutError:
            if not trickle:
                continue
            try:
                sock.sendall(b"x")
            except OSError:
                return b""
        except ConnectionResetError:
            return b""
