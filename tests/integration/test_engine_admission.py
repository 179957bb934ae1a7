"""Admission by the engine's state on the real engine.

MAX_ENGINE_WAITING (a gateway of its own, a batch of 4): a burst
larger than the batch and the waiting room allow is refused at once past them, with
Retry-After, before any engine work, and counted by reason; the requests admitted are
served whole. The bound holds within a step: requests handed to the engine since its last
step count as waiting.

MAX_KV_CACHE_USAGE (another gateway, started with the first): refused while a request holds KV
blocks, admitted when the engine is idle; only vLLM's scheduler stats, read after each step, say
so."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.support.access_log import request_millis
from tests.support.burst import send_burst
from tests.support.gateway import MODEL_NAME, GatewayProcess, GatewaySpec, running_gateways
from tests.support.metrics import metric_value

BATCH = 4
WAITING = 4
BURST = 24
ANSWER_TOKENS = 96
"""Each answer's length (ignore_eos): long enough that none admitted ends while the burst
is still being admitted on a loaded two-core host (an answer that ends frees its slot, and
the next request is rightly admitted in its place). With 24 tokens, one CI run admitted 9
while the two test lanes' engines shared the cores: most likely a first answer had ended
before the burst's last request was admitted."""
# A refusal a user would see as a stall (they take tens of ms): room for a loaded machine.
REFUSAL_STALL_S = 2.0
KV_BOUND = 0.0005
"""Below one running request's share of the test engine's 1 GiB KV cache (a prompt of some
50 tokens holds 4 of about 1,450 blocks, 0.0028): any request running crosses it."""


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """The two gateways, started together (their start-ups overlap)."""
    # JSON access lines: a slow refusal's message gives the gateway's own time for it.
    logs = {"SLUICEGATE_LOG_FORMAT": "json"}
    batch = {
        **logs,
        "SLUICEGATE_MAX_NUM_SEQS": str(BATCH),
        "SLUICEGATE_MAX_ENGINE_WAITING": str(WAITING),
    }
    kv = {**logs, "SLUICEGATE_MAX_KV_CACHE_USAGE": str(KV_BOUND)}
    folder = tmp_path_factory.mktemp("engine-admission")
    with running_gateways(folder, GatewaySpec(env=batch), GatewaySpec(env=kv)) as started:
        yield started


@pytest.fixture(scope="module")
def bounded(gateways: list[GatewayProcess]) -> GatewayProcess:
    return gateways[0]


def body(i: int) -> dict[str, object]:
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"Count to ten, run {i}."}],
        "max_tokens": ANSWER_TOKENS,
        "ignore_eos": True,
        "temperature": 0.8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def ask(client: httpx.AsyncClient, i: int) -> int:
    """The status of one request sent alone from the test's process, read whole."""
    async with client.stream("POST", "/v1/chat/completions", json=body(i)) as response:
        if response.status_code == 200:
            assert "data: [DONE]" in [line async for line in response.aiter_lines()]
        else:
            await response.aread()
        return response.status_code


async def test_a_burst_past_the_batch_and_the_waiting_room_is_refused_at_once(
    bounded: GatewayProcess,
) -> None:
    before = metric_value(bounded.url, "sluicegate_admission_refused_total",
                          reason="engine_waiting")  # fmt: skip
    async with httpx.AsyncClient(base_url=bounded.url, timeout=120) as client:
        assert await ask(client, -1) == 200  # the engine idle: nothing waits
        # From a process of its own: what is timed is the gateway, not pytest's process.
        burst = await asyncio.to_thread(send_burst, bounded.url, [body(i) for i in range(BURST)])
        assert await ask(client, -2) == 200  # the burst gone: admitted again
    admitted = [a for a in burst.answers if a.status == 200]
    refused = [a for a in burst.answers if a.status != 200]
    # At most a full batch running and a full waiting room; the rest refused, at once.
    assert BATCH <= len(admitted) <= BATCH + WAITING, len(admitted)
    assert all(a.done and a.tokens == ANSWER_TOKENS for a in admitted)  # whole (ignore_eos)
    assert {(a.status, a.code) for a in refused} == {(503, "overloaded")}
    assert all(a.retry_after is not None and 1 <= int(a.retry_after) <= 60 for a in refused)
    counted = metric_value(bounded.url, "sluicegate_admission_refused_total",
                           reason="engine_waiting") - before  # fmt: skip
    # At once: 70 ms median, 85 ms at most alone; the bound is a stall a user would see.
    slowest = max(refused, key=lambda a: a.took)
    assert slowest.took < REFUSAL_STALL_S, (
        f"a refusal took {slowest.took:.2f} s from the client, of {len(refused)} (the gateway "
        f"counted {counted:g} as engine_waiting; its own time for that one "
        f"{request_millis(bounded, slowest.request_id)} ms; the client's loop ran "
        f"{burst.late:.2f} s late at worst)"
    )
    assert counted == len(refused)


@pytest.fixture(scope="module")
def kv_bounded(gateways: list[GatewayProcess]) -> GatewayProcess:
    return gateways[1]


async def test_the_kv_cache_bound_reads_the_engines_own_stats_after_each_step(
    kv_bounded: GatewayProcess,
) -> None:
    """Only vLLM's scheduler stats (through the gateway's stat logger) know the KV cache's
    use: a request is refused while another runs, and admitted when the engine is idle."""
    before = metric_value(kv_bounded.url, "sluicegate_admission_refused_total",
                          reason="kv_cache")  # fmt: skip
    # Long enough to be still running when the refused request comes, on a loaded machine:
    # 155 tokens left after the five seen.
    long = {**body(0), "max_tokens": 160}
    async with httpx.AsyncClient(base_url=kv_bounded.url, timeout=120) as client:
        assert await ask(client, 1) == 200  # idle: nothing in use
        async with client.stream("POST", "/v1/chat/completions", json=long) as running:
            assert running.status_code == 200
            lines = running.aiter_lines()
            seen = 0
            async for line in lines:  # a few steps with it running: their stats are in
                seen += '"content":"' in line
                if seen >= 5:
                    break
            sent = await asyncio.to_thread(send_burst, kv_bounded.url, [body(2)])
            refused = sent.answers[0]
            assert (refused.status, refused.code) == (503, "overloaded")
            assert refused.retry_after is not None and 1 <= int(refused.retry_after) <= 60
            assert refused.took < REFUSAL_STALL_S, (
                f"the refusal took {refused.took:.2f} s from the client (the gateway's own "
                f"time {request_millis(kv_bounded, refused.request_id)} ms; the "
                f"client's loop ran {sent.late:.2f} s late at worst)"
            )
            assert "data: [DONE]" in [line async for line in lines]  # it ran whole
        assert await ask(client, 3) == 200  # the long one finished: admitted again
    counted = metric_value(kv_bounded.url, "sluicegate_admission_refused_total",
                           reason="kv_cache") - before  # fmt: skip
    assert counted == 1
