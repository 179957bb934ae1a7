"""Overload: ten times the admitted concurrency, all at once, on a gateway of its own."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import httpx
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
    limits = httpx.Limits(max_connections=FLOOD + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=small.url, limits=limits, timeout=300) as client:

        async def one() -> tuple[int, float, dict[str, object]]:
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            return response.status_code, time.perf_counter() - started, response.json()

        results = await asyncio.gather(*(one() for _ in range(FLOOD)))

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
