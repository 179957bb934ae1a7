"""What a long response keeps in memory while it streams: nothing per token once the token has
been sent, unless the cache may still store it, and then no more than an entry may hold."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx
import pytest

from sluicegate.cache import entry as entry_module
from sluicegate.engine.protocol import (
    ChoiceDelta,
    EngineStep,
    Prompt,
    SamplingOptions,
    TokenLogprob,
)
from sluicegate.inference.service import CompletionService
from sluicegate.wire.requests import ChatCompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread
from tests.support.memory import traced_alone

TOKENS = 2000
TOP = 20
# Each token carries 21 logprobs (~3 KB of Python objects): keeping them all costs ~6 MB.
GROWTH_LIMIT = 1024 * 1024


class LogprobEngine(FakeEngine):
    """`TOKENS` tokens, each with `TOP` alternatives, one token per step. It can hold still at
    chosen positions (`pause_at`) until the test lets it go on, so memory can be measured
    with the run half done."""

    def __init__(self, pause_at: tuple[int, ...] = ()) -> None:
        super().__init__(max_model_len=100_000)
        self.pause_at = pause_at
        self.reached = threading.Event()
        self.go_on = threading.Event()

    async def generate(  # type: ignore[override]
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        self.requests.append((request_id, prompt.ids, options))
        for i in range(TOKENS):
            if i in self.pause_at:
                self.go_on.clear()
                self.reached.set()
                # A threading event: the test runs on another thread's loop.
                await asyncio.to_thread(self.go_on.wait, 30)
            elif i % 50 == 0:
                await asyncio.sleep(0)
            top = tuple((f" alt{j}-{i}", -1.0 - j) for j in range(TOP))
            last = i == TOKENS - 1
            delta = ChoiceDelta(
                0, f" w{i}", 1, "length" if last else None, [TokenLogprob(f" w{i}", -0.5, top)]
            )
            yield EngineStep([delta], prompt_tokens=len(prompt.ids), finished=last)


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "talk a lot"}],
        "max_tokens": TOKENS,
        "logprobs": True,
        "top_logprobs": TOP,
        "temperature": 0,
        **extra,
    }


@pytest.fixture
def traced() -> Iterator[None]:
    with traced_alone():
        yield


async def test_a_stream_keeps_nothing_per_token_it_has_sent(traced: None) -> None:
    engine = LogprobEngine()
    service = CompletionService(engine, FAKE_MODEL)
    run = await service.prepare_chat(ChatCompletionRequest.model_validate(chat(stream=True)))
    events = service.stream(run)
    sizes = []
    count = 0
    async for _ in events:
        count += 1
        if count in (300, TOKENS - 100):
            sizes.append(tracemalloc.get_traced_memory()[0])
        if count == TOKENS - 100:
            break
    await events.aclose()
    grown = sizes[1] - sizes[0]
    assert grown < GROWTH_LIMIT, f"{grown} bytes kept for {TOKENS - 400} tokens already sent"


async def test_an_entry_too_large_to_store_is_neither_kept_nor_built(
    traced: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[int] = []
    encode = entry_module._Entry.model_dump_json

    def spy(self: Any, **kwargs: Any) -> str:
        data = encode(self, **kwargs)
        encoded.append(len(data))
        return data

    monkeypatch.setattr(entry_module._Entry, "model_dump_json", spy)
    limit = 64 * 1024
    pauses = (300, TOKENS - 100)
    engine = LogprobEngine(pause_at=pauses)
    sizes: list[int] = []
    caught_up = {pause: asyncio.Event() for pause in pauses}
    received = [0]  # content events, counted (not kept: that memory would count too)

    async def read(client: httpx.AsyncClient) -> httpx.Response:
        async with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"content":" w' in line:
                    received[0] += 1
                    if received[0] in caught_up:
                        caught_up[received[0]].set()
        return r

    async def measure() -> None:
        for pause in pauses:
            await asyncio.to_thread(engine.reached.wait, 30)
            engine.reached.clear()
            await caught_up[pause].wait()  # the client has had every token before the pause
            sizes.append(tracemalloc.get_traced_memory()[0])
            engine.go_on.set()

    with serve_in_thread(fake_app(engine, cache_max_entry_bytes=limit)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            response, _ = await asyncio.gather(read(client), measure())
            assert response.headers["x-cache"] == "MISS"
            engine.pause_at = ()
            again = await client.post("/v1/chat/completions", json=chat())
    assert received[0] == TOKENS, "the response is still served whole"
    assert again.headers["x-cache"] == "MISS" and len(engine.requests) == 2
    assert all(size <= limit for size in encoded), f"built entries of {encoded} bytes"
    grown = sizes[1] - sizes[0]
    assert grown < GROWTH_LIMIT, f"{grown} bytes kept while the entry could no longer be stored"
