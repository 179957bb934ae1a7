"""Reasoning from an upstream kept on every chat path: answers, rendered streams, streams passed
through, the response cache and its replays, a fallback's answer; and the request's reasoning
fields reaching the upstream.

The upstream is `tests.support.fault_upstream` with its `reasoning` control: it thinks as
vLLM's server with a reasoning parser writes it (`{"reasoning": ...}` deltas before the
content, `message.reasoning`, the usage's `completion_tokens_details`) and, like a server that
does not know the field, ignores `include_reasoning`. One gateway (no engine of its own, the
response cache on for every request) serves it over a models file, with a second model whose
one upstream goes down and falls back to it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream
from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.metrics import metric_value

THOUGHTS = ["Two", " and", " two", " make", " four."]
WORDS = "Water finds the open"
"""The fault upstream's first four words (`--chunks 4`)."""
PASSED = "sluicegate_upstream_passed_through_total"
BYPASS = {"cache-control": "no-cache, no-store"}
"""Neither looked up nor stored: a stream nothing collects, which may pass through."""
_ENVELOPE = re.compile(r'"(id|created|model)":("[^"]*"|\d+)')


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("reasoner") / "upstream.log"
    process = start_upstream(0, "--chunks", "4", log=log)
    try:
        process.control(reasoning=THOUGHTS)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("primary") / "upstream.log"
    process = start_upstream(0, "--chunks", "4", log=log)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory,
    reasoner: FaultUpstreamProcess,
    primary: FaultUpstreamProcess,
) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("gateway")
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: reasoner
    upstreams: [{{url: "{reasoner.url}"}}]
  - name: primary
    upstreams: [{{url: "{primary.url}"}}]
    fallbacks: [reasoner]
"""
    )
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_CACHE_POLICY": "all",
        "SLUICEGATE_UPSTREAM_MAX_RETRIES": "0",
    }
    with running_gateway(folder, env=env) as process:
        yield process


def _chat(**extra: Any) -> dict[str, Any]:
    """A chat nobody asked before (the cache keys it apart from every other test's)."""
    question = f"Think about {uuid.uuid4().hex}."
    return {"model": "reasoner", "messages": [{"role": "user", "content": question}], **extra}


def _post(
    gateway: GatewayProcess, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    reply = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    return reply


def _events(stream: str) -> list[dict[str, Any]]:
    assert stream.endswith("data: [DONE]\n\n"), stream
    return [json.loads(line[6:]) for line in stream.split("\n") if line.startswith("data: {")]


def _read(stream: str) -> tuple[str, str, dict[str, Any] | None]:
    """A chat stream's thoughts and content (each joined), its usage; every thought before
    the first content."""
    thought: list[str] = []
    content: list[str] = []
    usage: dict[str, Any] | None = None
    for event in _events(stream):
        usage = event.get("usage") or usage
        for choice in event["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                assert not "".join(content), "a thought after the content"
                thought.append(delta["reasoning"])
            content.append(delta.get("content") or "")
    return "".join(thought), "".join(content), usage


def _masked(stream: str) -> str:
    return _ENVELOPE.sub(r'"\1":-', stream)


def test_an_answer_keeps_the_upstreams_thoughts_and_their_count(
    gateway: GatewayProcess,
) -> None:
    answer = _post(gateway, _chat(), BYPASS).json()
    message = answer["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("".join(THOUGHTS), WORDS)
    assert answer["usage"]["completion_tokens"] == 4 + len(THOUGHTS)
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}


def test_a_rendered_stream_keeps_the_thoughts_before_the_content(
    gateway: GatewayProcess,
) -> None:
    before = metric_value(gateway.url, PASSED)
    body = _chat(stream=True, logprobs=True, stream_options={"include_usage": True})
    thought, content, usage = _read(_post(gateway, body, BYPASS).text)
    assert metric_value(gateway.url, PASSED) == before  # logprobs: rendered
    assert (thought, content) == ("".join(THOUGHTS), WORDS)
    assert usage is not None
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}


def test_a_stream_passed_through_is_the_upstreams_bytes(
    gateway: GatewayProcess, reasoner: FaultUpstreamProcess
) -> None:
    body = _chat(stream=True)
    before = metric_value(gateway.url, PASSED)
    passed = _post(gateway, body, BYPASS).text
    assert metric_value(gateway.url, PASSED) == before + 1
    direct = httpx.post(reasoner.url + "/chat/completions", json=body, timeout=30)
    # The upstream's chunks, thoughts and all, in the gateway's envelope.
    assert _masked(passed) == _masked(direct.text)
    assert '"model":"reasoner"' in passed and "-fault-" not in passed
    assert _read(passed)[:2] == ("".join(THOUGHTS), WORDS)


def test_without_reasoning_no_path_sends_thoughts(
    gateway: GatewayProcess, reasoner: FaultUpstreamProcess
) -> None:
    before = metric_value(gateway.url, PASSED)
    stream = _post(gateway, _chat(stream=True, include_reasoning=False), BYPASS).text
    # The upstream ignores the field: the gateway renders the stream, without the thoughts.
    assert metric_value(gateway.url, PASSED) == before
    assert reasoner.stats()["bodies"][-1]["include_reasoning"] is False
    assert "reasoning" not in stream and _read(stream)[1] == WORDS
    answer = _post(gateway, _chat(include_reasoning=False), BYPASS).json()
    message = answer["choices"][0]["message"]
    assert message.get("reasoning") is None and message["content"] == WORDS
    # Thought, if not shown: still counted.
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}


def test_a_cache_hit_and_a_replay_are_the_live_answer(
    gateway: GatewayProcess, reasoner: FaultUpstreamProcess
) -> None:
    body = _chat(temperature=0)
    asked = reasoner.stats()["requests"].get("/v1/chat/completions", 0)
    live = _post(gateway, body)
    assert live.headers["x-cache"] == "MISS"
    # The second goes the whole way, the third the fast path (a body rendered once).
    hits = [_post(gateway, body) for _ in range(2)]
    streamed = [_post(gateway, {**body, "stream": True, "stream_options": {"include_usage": True}})]
    streamed.append(
        _post(gateway, {**body, "stream": True, "stream_options": {"include_usage": True}})
    )
    assert reasoner.stats()["requests"]["/v1/chat/completions"] == asked + 1
    answer = live.json()
    for hit in hits:
        assert hit.headers["x-cache"] == "HIT"
        got = hit.json()
        assert got["choices"] == answer["choices"] and got["usage"] == answer["usage"]
    message = answer["choices"][0]["message"]
    assert message["reasoning"] == "".join(THOUGHTS)
    for replay in streamed:
        assert replay.headers["x-cache"] == "HIT"
        thought, content, usage = _read(replay.text)
        assert (thought, content) == (message["reasoning"], message["content"])
        assert usage == answer["usage"]


def test_a_fallbacks_answer_keeps_its_thoughts(
    gateway: GatewayProcess, primary: FaultUpstreamProcess
) -> None:
    primary.control(down=True)
    try:
        answer = _post(gateway, _chat(model="primary"), BYPASS)
        assert answer.headers["x-sluicegate-fallback"] == "primary"
        body = answer.json()
        assert body["model"] == "reasoner"
        assert body["choices"][0]["message"]["reasoning"] == "".join(THOUGHTS)
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}
        stream = _post(gateway, _chat(model="primary", stream=True), BYPASS)
        assert stream.headers["x-sluicegate-fallback"] == "primary"
        assert _read(stream.text)[:2] == ("".join(THOUGHTS), WORDS)
    finally:
        primary.control(reset_all=True)


def test_the_reasoning_fields_and_past_thoughts_reach_the_upstream(
    gateway: GatewayProcess, reasoner: FaultUpstreamProcess
) -> None:
    body = _chat(
        reasoning_effort="low",
        chat_template_kwargs={"enable_thinking": True, "depth": 2},
        thinking_token_budget=64,
    )
    body["messages"] += [
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        {"role": "user", "content": "And three?"},
    ]
    _post(gateway, body, BYPASS)
    sent = reasoner.stats()["bodies"][-1]
    assert sent["reasoning_effort"] == "low"
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "depth": 2}
    assert sent["thinking_token_budget"] == 64 and "include_reasoning" not in sent
    turn = sent["messages"][1]
    assert turn["reasoning_content"] == "Two and two." and "reasoning" not in turn
