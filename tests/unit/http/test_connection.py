"""`http.connection` on a real uvicorn over loopback: a request whose body came whole with
its head is marked so, and its body is read without a timer; one whose body comes later is
not, and still gets its body, or a 408 when the body does not finish in time."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from sluicegate.http.asgi import body_received
from sluicegate.http.body_limits import BodyLimitMiddleware
from sluicegate.http.connection import guarded_protocol
from tests.support.fakes import loopback_socket, run_in_thread

READ_TIMEOUT = 0.5


async def report(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers whether the body was marked as received, and the body it got."""
    if scope["type"] != "http":
        return
    marked = body_received(scope)
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    answer = json.dumps({"marked": marked, "body": body.decode()}).encode()
    length = (b"content-length", str(len(answer)).encode())
    await send({"type": "http.response.start", "status": 200, "headers": [length]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") == "/limited":
            await BodyLimitMiddleware(report, max_bytes=1000, read_timeout=READ_TIMEOUT)(
                scope, receive, send
            )
        else:
            await report(scope, receive, send)

    sock = loopback_socket()
    number = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=number,
        loop="asyncio",
        http=guarded_protocol(head_timeout=5, write_timeout=5, max_connections=100),
        lifespan="off",
        log_level="warning",
    )
    with run_in_thread(uvicorn.Server(config), sock):
        yield number


def exchange(port: int, path: str, parts: list[bytes], pause: float = 0.0) -> tuple[int, bytes]:
    """Send `parts` of one request, `pause` seconds apart; the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause)
            sock.sendall(part)
        received = b""
        while b"\r\n\r\n" not in received or not _complete(received):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def request_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


BODY = b'{"x": "a body"}'


def test_a_body_sent_with_its_head_is_marked_received(port: int) -> None:
    status, answer = exchange(port, "/", [request_head("/", len(BODY)) + BODY])
    assert status == 200
    assert json.loads(answer) == {"marked": True, "body": BODY.decode()}


def test_a_body_that_comes_after_its_head_is_not_marked(port: int) -> None:
    status, answer = exchange(port, "/", [request_head("/", len(BODY)), BODY], pause=0.2)
    assert status == 200
    assert json.loads(answer) == {"marked": False, "body": BODY.decode()}


def test_a_late_body_within_the_read_timeout_is_read(port: int) -> None:
    head = request_head("/limited", len(BODY))
    status, answer = exchange(port, "/limited", [head, BODY[:5], BODY[5:]], pause=0.1)
    assert status == 200
    assert json.loads(answer)["body"] == BODY.decode()


def test_a_body_that_does_not_finish_in_time_is_a_408(port: int) -> None:
    # Had the body been read without the timer, the rest arriving late would make a 200.
    head = request_head("/limited", len(BODY))
    status, answer = exchange(port, "/limited", [head + BODY[:5], BODY[5:]], pause=3 * READ_TIMEOUT)
    assert status == 408
    assert json.loads(answer)["error"]["code"] == "request_timeout"
