"""How a stream's events are handed to the server, read off a real response's HTTP chunks (each
ASGI body message is one chunk) over the fake engine: one message per delta, the events of
the delta that finishes the run with the closing ones, and `[DONE]` with the body's end. Each
message is a write to the client's socket and a wake-up of the client."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread


def _chunks(url: str, body: bytes) -> list[bytes]:
    """The chunks of a streamed answer to `body`, raw off the socket (the closing empty
    chunk left out)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nconnection: close\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        raw = b""
        while data := sock.recv(65536):
            raw += data
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    chunks = []
    while True:
        size, _, rest = rest.partition(b"\r\n")
        length = int(size, 16)
        if length == 0:
            assert rest == b"\r\n", "the body ends with the closing chunk"
            return chunks
        chunks.append(rest[:length])
        assert rest[length : length + 2] == b"\r\n"
        rest = rest[length + 2 :]


def _events(chunk: bytes) -> list[str]:
    return [e for e in chunk.decode().split("\n\n") if e]


async def test_the_last_delta_the_usage_and_done_leave_in_two_writes() -> None:
    engine = FakeEngine(words=["Hi", " there", "!"], max_model_len=256)
    body = json.dumps({
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    with serve_in_thread(fake_app(engine)) as url:
        chunks = await asyncio.to_thread(_chunks, url, body)
    assert len(chunks) == 4, chunks
    first, second, last, done = chunks
    # The opening role chunk goes with the first token: both come from the first delta.
    assert [json.loads(e[6:])["choices"][0]["delta"] for e in _events(first)] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
    ]
    assert json.loads(_events(second)[0][6:])["choices"][0]["delta"] == {"content": " there"}
    # The last token and its finish reason (two chunks, as vLLM's server sends them), then
    # the usage: all three from the last delta and the closing, in one write.
    text, finishing, usage = (json.loads(e[6:]) for e in _events(last))
    assert text["choices"][0]["delta"] == {"content": "!"}
    assert finishing["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert done == b"data: [DONE]\n\n"
