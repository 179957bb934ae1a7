"""`UpstreamEngine.generate` with a reasoning upstream (httpx's mock transport): the request
carries the reasoning fields, and the steps carry the thoughts and their count, whether the
upstream streams (vLLM's deltas) or answers the streamed request with one JSON body."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sluicegate.engine.protocol import ChatPrompt, ChoiceDelta, Prompt, SamplingOptions
from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig, UpstreamConfig
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.engine.upstream.server import Upstream
from sluicegate.wire.requests import reasoning_options

PROMPT = Prompt([], chat=ChatPrompt([{"role": "user", "content": "2+2?"}]))
USAGE = {
    "prompt_tokens": 3,
    "completion_tokens": 4,
    "completion_tokens_details": {"reasoning_tokens": 2},
}


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


def _delta(finish: str | None = None, **delta: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _streamed() -> httpx.Response:
    return httpx.Response(
        200,
        content=_sse(
            _delta(role="assistant", content=""),
            _delta(reasoning="Two and"),
            _delta(reasoning=" two."),
            _delta(content="Four"),
            _delta("stop"),
            {"choices": [], "usage": USAGE},
        ),
        headers={"content-type": "text/event-stream"},
    )


def _whole() -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Four",
                        "reasoning": "Two and two.",
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        },
    )


ANSWERS = {"streamed": _streamed, "whole": _whole}


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("pass_through", [False, True])
async def test_the_thoughts_and_their_count_come_through(answer: str, pass_through: bool) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return ANSWERS[answer]()

    upstream = Upstream(
        "http://10.0.0.1:8000/v1",
        1.0,
        PoolConfig(),
        BreakerConfig(),
        transport=httpx.MockTransport(handler),
    )
    engine = UpstreamEngine(UpstreamConfig(urls=((upstream.url, 1.0),)), [upstream], "m", 2048)
    options = SamplingOptions(
        max_tokens=8,
        reasoning=reasoning_options("high", None, include=False),
        pass_through=pass_through,
    )
    deltas: list[ChoiceDelta] = []
    async for step in engine.generate("r", PROMPT, options, arrival_time=0.0):
        deltas += step.choices
    await engine.shutdown()
    assert sent[0]["reasoning_effort"] == "high" and sent[0]["include_reasoning"] is False
    assert sum(d.num_tokens for d in deltas) == 4
    assert sum(d.reasoning_tokens for d in deltas) == 2
    assert deltas[-1].finish_reason == "stop"
    if pass_through and answer == "streamed":
        # Handed on as the upstream's own events, thoughts included.
        raw = "".join(d.raw or "" for d in deltas)
        assert '"reasoning": "Two and"' in raw and '"reasoning": " two."' in raw
    else:
        assert "".join(d.reasoning for d in deltas) == "Two and two."
        assert "".join(d.text for d in deltas) == "Four"
