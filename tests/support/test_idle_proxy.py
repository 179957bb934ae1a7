"""The idle-cutting proxy (tests/support/idle_proxy.py), itself a test double: it cuts a
connection quiet for its idle time, on both sides, and not one whose bytes keep passing in
either direction."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.idle_proxy import IdleProxy, running_idle_proxy

IDLE = 0.4


class Talker(socketserver.BaseRequestHandler):
    """Echoes what it reads; `T` makes it send 8 dots `IDLE / 4` apart instead (a stream the
    client only reads). Notes when its client's side closed."""

    closed: threading.Event

    def handle(self) -> None:
        while data := self.request.recv(1024):
            if data == b"T":
                for _ in range(8):
                    time.sleep(IDLE / 4)
                    self.request.sendall(b".")
            else:
                self.request.sendall(data)
        type(self).closed.set()


@pytest.fixture
def proxy() -> Iterator[IdleProxy]:
    Talker.closed = threading.Event()
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Talker) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        host, port = server.server_address[:2]
        with running_idle_proxy(f"http://{host}:{port}", idle=IDLE) as proxy:
            yield proxy
        server.shutdown()


def connect(proxy: IdleProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=10)


def test_an_idle_connection_is_cut_on_both_sides(proxy: IdleProxy) -> None:
    with connect(proxy) as client:
        client.sendall(b"hi")
        assert client.recv(16) == b"hi"
        quiet = time.monotonic()
        assert client.recv(16) == b""  # closed by the proxy
        took = time.monotonic() - quiet
    # At the idle time, not before; 10 times it for a loaded machine.
    assert IDLE * 0.9 <= took < IDLE * 10, f"cut after {took:.2f} s (idle {IDLE} s)"
    assert Talker.closed.wait(5), "the server's side was not closed"
    assert proxy.cuts == 1


def test_a_connection_whose_bytes_keep_passing_either_way_is_not_cut(proxy: IdleProxy) -> None:
    with connect(proxy) as client:
        for _ in range(8):  # the client talks, IDLE / 4 apart: 2 idle times in all
            time.sleep(IDLE / 4)
            client.sendall(b"x")
            assert client.recv(16) == b"x"
        client.sendall(b"T")  # then only the server does, for as long
        got = b""
        while len(got) < 8:
            piece = client.recv(16)
            assert piece, f"cut after {len(got)} of the server's bytes"
            got += piece
    assert proxy.cuts == 0
