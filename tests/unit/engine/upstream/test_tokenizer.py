"""The upstream's `/tokenize`, probed at start-up over a fake upstream (httpx's mock
transport): the budget counts with it only when a known text comes back as token ids; any
other 200 (llama.cpp's server, asked in vLLM's shape, counts nothing) turns the budget off
with the start-up warning, as no `/tokenize` at all does."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.engine.upstream.tokenizer import PROBE_TEXT, RemoteTokenizer
from sluicegate.errors import EngineUnavailableError

URL = "http://10.0.0.1:8000/v1"
BUDGET_OFF = "the token budget is off for fake-model"


class FakeTokenizingUpstream:
    """Lists one model; answers `/tokenize` and `/detokenize` with `answer`, and records what
    they were asked."""

    def __init__(self, answer: httpx.Response) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake-model"}]})
        if request.url.path in ("/tokenize", "/detokenize"):
            self.asked.append(json.loads(request.content))
            return self.answer
        return httpx.Response(404)


async def _start(fake: FakeTokenizingUpstream) -> UpstreamEngine:
    config = UpstreamConfig(urls=((URL, 1.0),), health_interval=60)
    return await UpstreamEngine.start(config, wait=1, transport=httpx.MockTransport(fake.handler))


async def test_a_tokenize_that_counts_the_probe_text_is_used() -> None:
    vllm = {"count": 3, "max_model_len": 2048, "tokens": [101, 7, 42], "token_strs": None}
    fake = FakeTokenizingUpstream(httpx.Response(200, json=vllm))
    engine = await _start(fake)
    try:
        assert isinstance(engine.tokenizer, RemoteTokenizer)
        assert fake.asked[0]["prompt"] == PROBE_TEXT
        assert fake.asked[0]["model"] == "fake-model"
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json={"tokens": []}),  # llama.cpp's, given `prompt`, not `content`
        httpx.Response(200, json={"count": 3}),  # no `tokens`: was a KeyError at start-up
        httpx.Response(200, json={"tokens": ["Sl", "uice"]}),
        httpx.Response(200, json={"tokens": [1, True]}),
        httpx.Response(200, json={"count": 9, "tokens": [1, 2, 3]}),
        httpx.Response(200, text="<html>tokenizer</html>"),
        httpx.Response(404, json={"detail": "Not Found"}),
    ],
    ids=["empty", "no-tokens", "strings", "bool", "wrong-count", "not-json", "absent"],
)
async def test_a_tokenize_that_does_not_count_turns_the_budget_off_with_a_warning(
    answer: httpx.Response, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="sluicegate.engine.upstream.tokenizer")
    engine = await _start(FakeTokenizingUpstream(answer))
    try:
        assert engine.tokenizer is None
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any(f"{URL} has no usable /tokenize" in w and BUDGET_OFF in w for w in warnings)
    finally:
        await engine.shutdown()


async def test_a_bad_tokenize_answer_after_start_up_is_an_error_not_a_crash() -> None:
    fake = FakeTokenizingUpstream(httpx.Response(200, json={"count": 3}))
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handler)) as client:
        remote = RemoteTokenizer(client, "http://10.0.0.1:8000", "fake-model")
        with pytest.raises(EngineUnavailableError, match="no list of token ids"):
            await remote.encode_chat([{"role": "user", "content": "hi"}])
        with pytest.raises(EngineUnavailableError, match="no prompt"):
            await remote.decode([1, 2])
