"""The upstreams' transports against a misbehaving server on loopback: aiohttp's under
httpx's API (`engine.upstream.transport`) and httpx's own, side by side.

The server is a raw asyncio one in the test's own loop, doing on the wire what a failing
upstream does: refuse, reset (RST) or close before its headers or mid-body, stall, answer
something that is not HTTP. Each transport must raise the httpx error of that event, and
never a timeout for a reset: the engine takes a timeout for a stall (`_stalled`).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from sluicegate.engine.upstream.config import PoolConfig
from sluicegate.engine.upstream.transport import UpstreamTransport, upstream_transport
from tests.support.gateway import free_port

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
POOL = PoolConfig(connect_timeout=2.0, read_timeout=0.5, pool_timeout=0.5)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0), as a crashed or killed peer does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _reset_before(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    _reset(writer)


async def _close_before(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.close()


async def _reset_during(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(HEAD + _chunk(b"data: 1\n\n"))
    await writer.drain()
    await asyncio.sleep(0.05)
    _reset(writer)


async def _close_during(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(HEAD + _chunk(b"data: 1\n\n"))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()


async def _stall_before(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    await asyncio.sleep(30)


async def _stall_during(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(HEAD + _chunk(b"data: 1\n\n"))
    await writer.drain()
    await asyncio.sleep(30)


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    await writer.drain()
    writer.close()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            await _read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(HEAD + b"".join(_chunk(b"data: %d\n\n" % i) for i in range(3)) + b"0\r\n\r\n")
        await writer.drain()


@pytest.fixture(params=["aiohttp", "httpcore"])
def transport_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _client(name: str, pool: PoolConfig = POOL) -> httpx.AsyncClient:
    pool = PoolConfig(
        max_connections=pool.max_connections,
        connect_timeout=pool.connect_timeout,
        read_timeout=pool.read_timeout,
        pool_timeout=pool.pool_timeout,
        transport="aiohttp" if name == "aiohttp" else "httpcore",
    )
    transport = upstream_transport(pool)
    assert isinstance(transport, UpstreamTransport) == (name == "aiohttp")
    return httpx.AsyncClient(
        transport=transport,
        limits=httpx.Limits(max_connections=pool.max_connections),
        timeout=httpx.Timeout(
            connect=pool.connect_timeout, read=pool.read_timeout, write=5.0, pool=pool.pool_timeout
        ),
        trust_env=False,
    )


async def _serving(behaviour: Behaviour) -> AsyncIterator[str]:
    server = await asyncio.start_server(behaviour, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()


async def _failure(name: str, behaviour: Behaviour) -> httpx.TransportError:
    """The error a streamed POST meets, from the request or while reading its body."""
    served = _serving(behaviour)
    url = await anext(served)
    client = await _client(name)
    try:
        async with asyncio.timeout(10):  # a safety bound: the read timeout is 0.5 s
            async with client.stream("POST", url, content=b'{"stream": true}') as response:
                async for _ in response.aiter_bytes():
                    pass
    except httpx.TransportError as exc:
        return exc
    finally:
        await client.aclose()
        await served.aclose()
    raise AssertionError(f"{name}: the request did not fail")


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        (_reset_before, (httpx.ReadError, httpx.RemoteProtocolError)),
        (_close_before, (httpx.RemoteProtocolError,)),
        (_reset_during, (httpx.ReadError, httpx.RemoteProtocolError)),
        (_close_during, (httpx.RemoteProtocolError,)),
        (_not_http, (httpx.RemoteProtocolError,)),
        (_stall_before, (httpx.ReadTimeout,)),
        (_stall_during, (httpx.ReadTimeout,)),
    ],
    ids=lambda v: getattr(v, "__name__", "").strip("_") or None,
)
async def test_each_fault_is_the_httpx_error_of_that_event(
    transport_name: str, behaviour: Behaviour, expected: tuple[type[Exception], ...]
) -> None:
    error = await _failure(transport_name, behaviour)
    assert isinstance(error, expected), f"{transport_name}: {type(error).__name__}: {error}"
    if behaviour not in (_stall_before, _stall_during):
        # A reset is never a stall: the engine would wait out a timeout's meaning for it.
        assert not isinstance(error, httpx.TimeoutException), repr(error)


async def test_a_refused_connection_is_a_connect_error(transport_name: str) -> None:
    client = await _client(transport_name)
    try:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{free_port()}/v1/models", content=b"{}")
    finally:
        await client.aclose()


async def test_a_full_pool_waits_out_the_pool_timeout_as_a_connect_failure(
    transport_name: str,
) -> None:
    """One connection, held by a stalled stream: the next request's wait for it ends as
    httpx's own transport ends it (`PoolTimeout`) or as aiohttp's does (`ConnectTimeout`),
    both of which the engine takes for "could not connect"."""
    served = _serving(_stall_during)
    url = await anext(served)
    client = await _client(transport_name, PoolConfig(max_connections=1, pool_timeout=0.3))
    try:
        async with client.stream("POST", url, content=b"{}") as held:
            assert held.status_code == 200
            with pytest.raises((httpx.PoolTimeout, httpx.ConnectTimeout)):
                async with asyncio.timeout(10):
                    await client.post(url, content=b"{}")
    finally:
        await client.aclose()
        await served.aclose()


async def test_a_stream_arrives_whole_over_one_kept_alive_connection(transport_name: str) -> None:
    connections = 0

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _answer(reader, writer)

    served = _serving(counted)
    url = await anext(served)
    client = await _client(transport_name)
    try:
        for _ in range(3):
            async with client.stream("POST", url, content=b'{"stream": true}') as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "text/event-stream"
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
            assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert connections == 1
    finally:
        await client.aclose()
        await served.aclose()


def test_http2_and_httpcore_keep_httpx_own_transport() -> None:
    for pool in (PoolConfig(http2=True), PoolConfig(transport="httpcore")):
        transport = upstream_transport(pool)
        assert type(transport) is httpx.AsyncHTTPTransport
        assert transport._pool._http2 == pool.http2
        assert transport._pool._max_connections == pool.max_connections
    assert isinstance(upstream_transport(PoolConfig()), UpstreamTransport)
