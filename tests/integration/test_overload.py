"""Overload: ten times the admitted concurrency, all at once, on a gateway of its own."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.integration.server import MODEL_NAME, GatewayProcess, metric_value, start_gateway

ADMITTED = 8
FLOOD = 10 * ADMITTED
TOKENS = 16
# The gateway process (not the engine core) may grow at most this much during the flood.
RSS_GROWTH_BOUND_MB = 150


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("overload"), env={"SLUICEGATE_MAX_IN_FLIGHT": str(ADMITTED)}
    )
    yield gateway
    gateway.stop()


async def test_a_flood_is_refused_fast_while_admitted_requests_complete(
    small: GatewayProcess,
) -> None:
    process = psutil.Process(small.process.pid)
    rss_before = process.memory_info().rss
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Write about the sea."}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
    }
    payload = json.dumps(body).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(payload)
    ) + payload
    host, port = small.url.removeprefix("http://").split(":")
    # Plain sockets, all connected first: the timing is the server's, not a client library's.
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(FLOOD)]

    async def one(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[int, float, dict[str, object]]:
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        elapsed = time.perf_counter() - started
        status = int(head.split(b" ", 2)[1])
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        reply = json.loads(await reader.readexactly(length))
        writer.close()
        return status, elapsed, reply

    results = await asyncio.gather(*(one(r, w) for r, w in connections))

    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(admitted) + len(refused) == FLOOD, sorted({r[0] for r in results})
    assert ADMITTED <= len(admitted) < FLOOD // 2
    for _, _, reply in admitted:
        assert reply["usage"]["completion_tokens"] == TOKENS  # type: ignore[index]
        assert reply["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    for _, _, reply in refused:
        assert reply["error"]["code"] == "overloaded"  # type: ignore[index]
    latencies = sorted(r[1] for r in refused)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"refusals: {len(refused)}, median {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms; admitted {len(admitted)}"
    )
    assert p99 < 0.100, f"P99 refusal latency {p99 * 1000:.0f} ms"

    growth_mb = (process.memory_info().rss - rss_before) / 2**20
    print(f"gateway RSS growth during the flood: {growth_mb:.1f} MB")
    assert growth_mb < RSS_GROWTH_BOUND_MB

    deadline = time.monotonic() + 2
    while metric_value(small.url, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "requests left running in the engine"
        await asyncio.sleep(0.05)
    assert metric_value(small.url, "vllm:num_requests_waiting") == 0
