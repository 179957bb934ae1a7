"""Pass-through (wire/passthrough.py): a plain stream's chunks handed on as the upstream sent
them are the bytes the gateway would have rendered, ids and timestamps aside.

One fault upstream (`tests.support.fault_upstream`, which writes OpenAI's chunks) paced so
that each chunk comes in a read of its own (the rendered path joins the chunks of one read
into one event); two `sluicegate serve` processes in front of it, one with
`UPSTREAM_PASS_THROUGH` (the default) and one without, both serving the upstream's model
under another name, so the model name is rewritten. Each request goes to both and the
streams are compared byte for byte once each one's id and `created` are masked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream
from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.metrics import metric_value

MODEL = "house-model"
"""The name the gateways serve the upstream's `fault-model` under."""
PASSED = "sluicegate_upstream_passed_through_total"
_ID = re.compile(r'"id":"(?:chatcmpl|cmpl)-[0-9a-f]+"')
_CREATED = re.compile(r'"created":\d+')


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("fault") / "upstream.log"
    process = start_upstream(0, "--chunks", "6", log=log)
    try:
        # 20 ms between chunks: each comes in a read of its own, so neither path joins any.
        process.control(slow=0.02)
        yield process
    finally:
        process.stop()


def _gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess, passing: str
) -> Iterator[GatewayProcess]:
    env = {
        "SLUICEGATE_UPSTREAM_URLS": upstream.url,
        "SLUICEGATE_SERVED_MODEL_NAME": MODEL,
        "SLUICEGATE_CACHE_POLICY": "off",
        "SLUICEGATE_UPSTREAM_PASS_THROUGH": passing,
    }
    with running_gateway(tmp_path_factory.mktemp(f"pass-{passing}"), env=env) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def passing(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path_factory, upstream, "true")


@pytest.fixture(scope="module")
def rendering(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path_factory, upstream, "false")


def _stream(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> str:
    with httpx.Client(timeout=30) as client:
        reply = client.post(gateway.url + path, json={**body, "stream": True})
    assert reply.status_code == 200, reply.text
    return reply.text


def _masked(stream: str) -> str:
    """The stream with its id and creation time masked, once each is checked to be the same
    in every event (a stream must not mix the upstream's envelope with the gateway's), and
    each run of text deltas joined into its first (`_joined`)."""
    assert len(set(_ID.findall(stream))) == 1, stream
    assert len(set(_CREATED.findall(stream))) == 1, stream
    return _joined(_CREATED.sub('"created":0', _ID.sub('"id":"-"', stream)))


def _text_of(event: dict[str, Any]) -> tuple[str, str] | None:
    """The text of an event that carries nothing but text (its field, and the text)."""
    choices = event.get("choices") or []
    if len(choices) != 1 or event.get("usage") or choices[0].get("finish_reason"):
        return None
    choice = choices[0]
    if "text" in choice:
        return "text", choice["text"]
    delta = choice.get("delta") or {}
    if set(delta) == {"content"}:
        return "content", delta["content"]
    return None


def _joined(stream: str) -> str:
    """`stream` with each run of events that carry only text joined into one, the run's first
    with the run's text. The rendered path joins the chunks that arrive in one read (the
    upstream is paced so that each comes in a read of its own, but a loaded machine can stall
    longer than the pace); the passed-through stream keeps the upstream's. Every other event is
    compared as it was sent, byte for byte."""
    events = [line for line in stream.split("\n\n") if line]
    out: list[str] = []
    run: list[tuple[dict[str, Any], str]] = []  # (event, text)

    def flush() -> None:
        if run:
            event = run[0][0]
            field, _ = _text_of(event) or ("", "")
            text = "".join(text for _, text in run)
            choice = event["choices"][0]
            if field == "text":
                choice["text"] = text
            else:
                choice["delta"]["content"] = text
            out.append("data: " + json.dumps(event, separators=(",", ":"), ensure_ascii=False))
        run.clear()

    for raw in events:
        payload = raw.removeprefix("data: ")
        event = json.loads(payload) if payload != "[DONE]" else None
        found = _text_of(event) if isinstance(event, dict) else None
        if found is None:
            flush()
            out.append(raw)
            continue
        run.append((event, found[1]))
    flush()
    return "\n\n".join(out) + "\n\n"


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}]}
TEXT = {"model": MODEL, "prompt": "Say something."}
CASES = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat, usage": ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
    "chat, cut by max_tokens": ("/v1/chat/completions", {**CHAT, "max_tokens": 3}),
    "text": ("/v1/completions", TEXT),
    "text, usage, cut": (
        "/v1/completions",
        {**TEXT, "max_tokens": 2, "stream_options": {"include_usage": True}},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_stream_passed_through_is_the_stream_the_gateway_renders(
    case: str, passing: GatewayProcess, rendering: GatewayProcess
) -> None:
    path, body = CASES[case]
    before = metric_value(passing.url, PASSED)
    passed = _stream(passing, path, body)
    rendered = _stream(rendering, path, body)
    assert metric_value(passing.url, PASSED) == before + 1  # it did take the pass-through
    assert metric_value(rendering.url, PASSED) == 0
    assert _masked(passed) == _masked(rendered)
    # The upstream's envelope was replaced, not just passed on.
    assert '"model":"fault-model"' not in passed and f'"model":"{MODEL}"' in passed
    assert "-fault-" not in passed  # the upstream's ids are chatcmpl-fault-N
    assert passed.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": True, "top_logprobs": 1},
        {"n": 2, "temperature": 0.5},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    ],
    ids=["logprobs", "n=2", "tools"],
)
def test_streams_that_need_rendering_are_not_passed_through(
    extra: dict[str, Any], passing: GatewayProcess
) -> None:
    before = metric_value(passing.url, PASSED)
    stream = _stream(passing, "/v1/chat/completions", {**CHAT, **extra})
    assert stream.endswith("data: [DONE]\n\n")
    assert metric_value(passing.url, PASSED) == before


def test_a_cached_stream_is_collected_not_passed_through(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> None:
    # With the response cache on, a cacheable miss leads a flight whose output is stored:
    # rendered, and the stored answer replays as the live one did.
    env = {
        "SLUICEGATE_UPSTREAM_URLS": upstream.url,
        "SLUICEGATE_SERVED_MODEL_NAME": MODEL,
        "SLUICEGATE_CACHE_POLICY": "all",
    }
    body = {**CHAT, "temperature": 0}
    with running_gateway(tmp_path_factory.mktemp("cached"), env=env) as gateway:
        first = _stream(gateway, "/v1/chat/completions", body)
        assert metric_value(gateway.url, PASSED) == 0
        choices = [
            json.loads(line[6:])["choices"]
            for line in first.split("\n")
            if line.startswith("data: {")
        ]
        assert "".join(c[0]["delta"].get("content") or "" for c in choices if c)
