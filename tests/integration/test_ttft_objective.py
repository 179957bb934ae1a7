"""TTFT_OBJECTIVE on the real engine: a burst far past what the engine can start within the
objective is mostly refused at once, before any engine work, with Retry-After, and the
requests admitted are served whole (a gateway of its own)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.access_log import refusal_times
from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway
from tests.support.metrics import metric_value

OBJECTIVE_S = 1.0
BURST = 64


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path_factory.mktemp("ttft-objective"),
        env={
            "SLUICEGATE_TTFT_OBJECTIVE": str(OBJECTIVE_S),
            "SLUICEGATE_LOG_FORMAT": "json",  # the access lines give each request's time
        },
    ) as gateway:
        yield gateway


def body(i: int) -> dict[str, object]:
    # Each prompt its own (no prefix-cache or response-cache help), ~60 tokens.
    words = " ".join(f"item{i}-{j}" for j in range(12))
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"Sort these: {words}"}],
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0.8,
        "stream": True,
    }


async def ask(client: httpx.AsyncClient, i: int) -> tuple[int, float, str | None, bool]:
    """Status, seconds to the first content (or to the refusal), Retry-After, whole."""
    started = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body(i)) as response:
        if response.status_code != 200:
            await response.aread()
            code = response.json()["error"]["code"]
            assert code == "overloaded", code
            return (
                response.status_code,
                time.perf_counter() - started,
                response.headers.get("retry-after"),
                False,
            )
        first = None
        async for line in response.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - started
            if line == "data: [DONE]":
                assert first is not None
                return 200, first, None, True
    return 200, first or 0.0, None, False


async def test_a_burst_past_the_objective_is_refused_at_once_and_the_rest_keeps_it(
    guarded: GatewayProcess,
) -> None:
    refused_before = metric_value(guarded.url, "sluicegate_admission_refused_total",
                                  reason="ttft_objective")  # fmt: skip
    limits = httpx.Limits(max_connections=BURST + 8)
    async with httpx.AsyncClient(base_url=guarded.url, timeout=120, limits=limits) as client:
        for i in range(10):  # one at a time: the engine's drain rate is measured
            status, _, _, whole = await ask(client, 1000 + i)
            if status != 200:
                # Even alone a run may be refused once the engine was measured slower than
                # the objective (a loaded machine: the other lane beside this one). With
                # nothing waiting, one run is admitted whatever the estimate once `trickle`
                # (1 s) has passed since the last: the estimate cannot latch shut.
                await asyncio.sleep(1.1)
                status, _, _, whole = await ask(client, 1000 + i)
            assert (status, whole) == (200, True)
        log_start = len(guarded.log())
        results = await asyncio.gather(*(ask(client, i) for i in range(BURST)))
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert admitted and refused, [r[0] for r in results]
    assert all(whole for _, _, _, whole in admitted)
    assert {status for status, *_ in refused} == {503}
    assert all(retry is not None and 1 <= int(retry) <= 60 for _, _, retry, _ in refused)
    # Refused before any engine work, while the admitted ones are being prefilled: a refusal
    # later than the objective itself would be of no use to the client (how fast they are
    # is measured, with the refusals' P50 and P99, by bench/goodput.py, not asserted here).
    # Timed in the gateway, from each request's arrival less the wait for its body (its
    # access line): the client's own view adds the time it takes to start 64 requests, 1.4 s
    # once on a busy machine, and 34 s once on a machine so loaded that all 63 refusals came
    # 3.2 s after their headers (the bodies, sent after all the headers, followed late).
    assert len(admitted) <= BURST // 4, len(admitted)
    counted = metric_value(guarded.url, "sluicegate_admission_refused_total",
                           reason="ttft_objective") - refused_before  # fmt: skip
    waits = sorted(t for _, t, _, _ in refused)
    times = refusal_times(guarded, log_start, len(refused))
    measured = (
        f"{len(refused)} refusals: in the gateway median {statistics.median(times):.0f} ms, "
        f"max {times[-1]:.0f} ms; from the client median {statistics.median(waits):.2f} s; "
        f"the gateway counted {counted:g} refused for the objective"
    )
    assert len(times) == len(refused), measured
    assert statistics.median(times) < OBJECTIVE_S * 1000, measured
    # Not asserted: that every admitted first token came within the objective. A burst that
    # lands during an engine step waits for that step, which the estimate does not foresee;
    # here the admitted came 6 to 27% past 1 s (docs/operations.md says so; issue 22).
    assert counted == len(refused)
