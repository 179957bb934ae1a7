"""A client that leaves aborts its engine request: streamed and non-streamed alike."""

from __future__ import annotations

import asyncio
import json
import time

from tests.support.metrics import metric_value

RUNNING = "vllm:num_requests_running"
ABORT_BOUND_S = 5.0


def long_request(model: str, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


async def wait_for_running(url: str, predicate: object, within: float) -> float:
    deadline = time.monotonic() + within
    while True:
        value = await asyncio.to_thread(metric_value, url, RUNNING)
        if predicate(value):  # type: ignore[operator]
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{RUNNING} stayed at {value} for {within:g} s")
        await asyncio.sleep(0.05)


async def check_abort(base_url: str, model: str, stream: bool) -> None:
    assert await wait_for_running(base_url, lambda v: v == 0, 10) == 0
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(long_request(model, stream))
    await writer.drain()
    if stream:
        first = await asyncio.wait_for(reader.readuntil(b"data: "), 30)
        assert b"200 OK" in first
    await wait_for_running(base_url, lambda v: v >= 1, 30)
    writer.close()
    # The abort reaches the engine: idle within a fraction of a second, where the 1,500
    # tokens would take it a minute; the bound leaves room for a loaded two-core machine
    # (wait_for_running's failure names the engine's own running count).
    await wait_for_running(base_url, lambda v: v == 0, ABORT_BOUND_S)


async def test_disconnect_aborts_a_stream(base_url: str, model: str) -> None:
    await check_abort(base_url, model, stream=True)


async def test_disconnect_aborts_a_non_streamed_request(base_url: str, model: str) -> None:
    await check_abort(base_url, model, stream=False)
