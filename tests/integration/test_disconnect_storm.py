"""A hundred clients drop their streams mid-generation."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.support.metrics import metric_value

CLIENTS = 100


def stream_request(model: str, i: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Story number {i}, please."}],
            "max_tokens": 1000,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def test_a_disconnect_storm_leaves_nothing_running(base_url: str, model: str) -> None:
    host, port = base_url.removeprefix("http://").split(":")

    async def open_stream(i: int) -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(stream_request(model, i))
        await writer.drain()
        # Mid-generation: the role chunk and at least one content delta have arrived.
        await asyncio.wait_for(reader.readuntil(b'"content":"'), 120)
        await asyncio.wait_for(reader.readuntil(b'"content":"'), 120)
        return writer

    writers = await asyncio.gather(*(open_stream(i) for i in range(CLIENTS)))
    assert await asyncio.to_thread(metric_value, base_url, "vllm:num_requests_running") > 0
    for writer in writers:
        writer.close()
    closed = time.monotonic()
    while True:
        running = await asyncio.to_thread(metric_value, base_url, "vllm:num_requests_running")
        waiting = await asyncio.to_thread(metric_value, base_url, "vllm:num_requests_waiting")
        if running == 0 and waiting == 0:
            print(f"{CLIENTS} streams dropped: engine idle after {time.monotonic() - closed:.2f} s")
            break
        # The aborts reach the engine: 0.23 s alone, where the streams would run for
        # minutes; the bound leaves room for a loaded two-core machine.
        assert time.monotonic() - closed < 5.0, (
            f"the engine's own counts {time.monotonic() - closed:.1f} s after the drop: "
            f"{running:g} running, {waiting:g} waiting"
        )
        await asyncio.sleep(0.05)

    reply = await asyncio.to_thread(
        httpx.post,
        f"{base_url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        timeout=60,
    )
    assert reply.status_code == 200
