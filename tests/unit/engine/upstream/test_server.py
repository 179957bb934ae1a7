"""`Upstream`: what its requests carry on the wire, through each transport. A raw asyncio server
on loopback records each request's head.

Inference requests go straight to the pool's transport (`Upstream.send`), the rest through the
pool's `httpx.AsyncClient`: both must send the same credentials and honour the same timeouts.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import httpx
import pytest

from sluicegate.engine.protocol import ChatPrompt, Prompt, SamplingOptions
from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig, UpstreamConfig
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.engine.upstream.server import Upstream

ANSWER = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"data":[]}'
)


class Recorder:
    """Answers each request with `answer` (or, `stalling`, with nothing), and keeps its head."""

    def __init__(self, stalling: bool = False, answer: bytes = ANSWER) -> None:
        self.heads: list[bytes] = []
        self.stalling = stalling
        self.answer = answer

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                if self.stalling:
                    await asyncio.sleep(30)
                writer.write(self.answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def header(self, index: int, name: bytes) -> bytes | None:
        for line in self.heads[index].split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name:
                return value.strip()
        return None


@pytest.fixture(params=["aiohttp", "httpcore"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _served(recorder: Recorder) -> AsyncIterator[int]:
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, int]]:
    recording = Recorder()
    async for port in _served(recording):
        yield recording, port


def _upstream(url: str, transport: str, api_key: str | None = None, read: float = 5.0) -> Upstream:
    pool = PoolConfig(
        transport="aiohttp" if transport == "aiohttp" else "httpcore",
        read_timeout=read,
        connect_timeout=2.0,
    )
    return Upstream(url, 1.0, pool, BreakerConfig(), api_key=api_key)


async def _both(url: str, transport: str, api_key: str) -> Upstream:
    """An upstream at `url` sent an inference request (straight to the transport), then a
    probe (through the client), then closed."""
    upstream = _upstream(url, transport, api_key=api_key)
    try:
        response = await upstream.send("/chat/completions", b"{}")
        try:
            assert response.status_code == 200
            assert await response.aread() == b'{"data":[]}'
        finally:
            await response.aclose()
        probe = await upstream.client.get("/models")
        assert probe.json() == {"data": []}
    finally:
        await upstream.close()
    return upstream


async def test_credentials_in_the_url_go_as_basic_auth_and_never_in_the_url(
    recorder: tuple[Recorder, int], transport: str
) -> None:
    """Over aiohttp, a URL's credentials beside an Authorization header were refused with a
    ValueError before any request went out; over either, they are basic auth, in place of
    the API key, as httpx's client sends a URL's own."""
    recording, port = recorder
    upstream = await _both(f"http://us%40er:p%3Ass@127.0.0.1:{port}/v1", transport, "k")
    assert upstream.url == upstream.label == f"http://127.0.0.1:{port}/v1"
    token = b"Basic " + base64.b64encode(b"us@er:p:ss")
    assert [recording.header(i, b"authorization") for i in range(2)] == [token, token]
    assert recording.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert recording.heads[1].startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert all(b"us%40er" not in head and b"p%3Ass" not in head for head in recording.heads)


async def test_an_inference_request_carries_the_clients_headers(
    recorder: tuple[Recorder, int], transport: str
) -> None:
    recording, port = recorder
    await _both(f"http://127.0.0.1:{port}/v1/", transport, "secret")
    assert len(recording.heads) == 2
    assert recording.header(0, b"authorization") == b"Bearer secret"
    assert recording.header(0, b"content-type") == b"application/json"
    assert recording.header(0, b"content-length") == b"2"
    assert recording.header(0, b"host") == f"127.0.0.1:{port}".encode()
    for name in (b"user-agent", b"accept", b"accept-encoding"):
        assert recording.header(0, name) == recording.header(1, name) is not None


async def test_an_inference_request_honours_the_read_timeout(transport: str) -> None:
    recording = Recorder(stalling=True)
    async for port in _served(recording):
        upstream = _upstream(f"http://127.0.0.1:{port}/v1", transport, read=0.3)
        try:
            with pytest.raises(httpx.ReadTimeout):
                # Bounded only against a hang: the read timeout is 0.3 s.
                await asyncio.wait_for(upstream.send("/chat/completions", b"{}"), 10)
        finally:
            await upstream.close()
        assert len(recording.heads) == 1


def _burst(events: int) -> bytes:
    """A streamed answer of `events` one-token chunks, then the finish, the usage and
    `[DONE]`, each in an HTTP chunk of its own, all in one write."""
    chunks = [
        b'data: {"choices":[{"index":0,"delta":{"content":"t%d"},"finish_reason":null}]}\n\n' % i
        for i in range(events)
    ]
    chunks.append(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    chunks.append(
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % events
    )
    chunks.append(b"data: [DONE]\n\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return head + b"\r\n" + body


async def test_a_burst_is_one_step_whichever_way_the_transport_reads(transport: str) -> None:
    """aiohttp's reads hand out all they hold, so its bodies are read without a task ahead
    of the engine; httpcore's hand out one chunk at a time, and are read ahead. Either way a
    burst of 32 events that came in one read is one step, not 32."""
    recording = Recorder(answer=_burst(32))
    async for port in _served(recording):
        upstream = _upstream(f"http://127.0.0.1:{port}/v1", transport)
        assert upstream.reads_whole == (transport == "aiohttp")
        engine = UpstreamEngine(UpstreamConfig(urls=((upstream.url, 1.0),)), [upstream], "m", 64)
        prompt = Prompt([], chat=ChatPrompt([{"role": "user", "content": "hi"}]))
        try:
            steps = [
                s
                async for s in engine.generate(
                    "r", prompt, SamplingOptions(max_tokens=32), arrival_time=0.0
                )
            ]
        finally:
            await upstream.close()
    assert len(steps) == 2, [len(s.choices) for s in steps]
    content, finish = steps
    assert content.choices[0].text == "".join(f"t{i}" for i in range(32))
    assert finish.finished and finish.choices[0].finish_reason == "stop"
