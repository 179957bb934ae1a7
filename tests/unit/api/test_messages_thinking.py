"""Thinking through `/v1/messages` over a fake engine that thinks (its thoughts split already,
as an upstream splits them): the answer's and the stream's signed thinking block, a cache hit
signing alike, a signed block taken back as the turn's reasoning (and one not signed here
refused before any engine work, in Anthropic's shape, also when the body is converted in the
worker process), `thinking` and `output_config` reaching the engine as vLLM's server maps
them, Claude Code's extras tolerated, count_tokens counting thoughts without verifying."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.api.route import LARGE_BODY_BYTES
from sluicegate.engine.protocol import ChatMessages, TemplateKwargs, Tools
from sluicegate.wire.reasoning_seal import ReasoningSeal
from tests.support.fakes import FAKE_MODEL, FakeEngine, WhitespaceTokenizer, fake_app

MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"
JSON = {"content-type": "application/json"}
KEY, EARLIER = "k" * 32, "e" * 32
SEAL = ReasoningSeal([KEY.encode()])
THOUGHTS = ["The user", " greets.", " Greet back."]
THOUGHT = "".join(THOUGHTS)
WORDS = ["Hello", " there", "!"]
THINKING = {"type": "enabled", "budget_tokens": 1024}


def body(text: str = "Say hello.", **extra: Any) -> dict[str, Any]:
    return {
        "model": FAKE_MODEL,
        "max_tokens": 2048,
        "thinking": THINKING,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def streamed_blocks(text: str) -> list[dict[str, Any]]:
    """The content blocks a stream built, each with its deltas applied."""
    built: dict[int, dict[str, Any]] = {}
    for event in events(text):
        if event["type"] == "content_block_start":
            built[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            block, delta = built[event["index"]], event["delta"]
            field = {"thinking_delta": "thinking", "signature_delta": "signature"}
            name = field.get(delta["type"], "text")
            block[name] += delta[name]
    return [built[index] for index in sorted(built)]


class PassingParser:
    """A reasoning parser for an engine whose deltas come split already: it lets them be."""

    name = "passing"

    def stream(self, prompt_ids: Sequence[int], template_kwargs: Mapping[str, Any]) -> Any:
        return self

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str, str]:
        return "", text

    def count(self) -> int:
        return 0


class ThoughtCountingTokenizer(WhitespaceTokenizer):
    """Counts an assistant turn's `reasoning` as a template that renders it would."""

    async def encode_chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        ids = await super().encode_chat(messages, tools, template_kwargs)
        return ids + [len(w) for m in messages for w in (m.get("reasoning") or "").split()]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=list(WORDS), reasoning_words=list(THOUGHTS), renders_chat=True)


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    settings = {"reasoning_key": KEY, "reasoning_previous_keys": EARLIER}
    with TestClient(fake_app(engine, max_model_len=4096, **settings)) as client:
        yield client


def test_an_answer_begins_with_a_thinking_block_the_gateway_signed(client: TestClient) -> None:
    sent = body(temperature=0.6, top_p=0.95, top_k=20)  # allowed with thinking, as vLLM does
    answer = client.post(MESSAGES, json=sent)
    assert answer.status_code == 200, answer.text
    message = answer.json()
    assert message["content"] == [
        {"type": "thinking", "thinking": THOUGHT, "signature": SEAL.sign(THOUGHT)},
        {"type": "text", "text": "".join(WORDS)},
    ]
    assert message["usage"]["output_tokens"] == len(THOUGHTS) + len(WORDS)


def test_without_thoughts_there_is_no_thinking_block(
    client: TestClient, engine: FakeEngine
) -> None:
    engine.reasoning_words = []
    message = client.post(MESSAGES, json=body()).json()
    assert message["content"] == [{"type": "text", "text": "".join(WORDS)}]
    streamed = client.post(MESSAGES, json=body(stream=True)).text
    assert "thinking" not in streamed and "signature" not in streamed


def test_a_stream_signs_its_thinking_block_before_the_text(client: TestClient) -> None:
    answer = client.post(MESSAGES, json=body(stream=True))
    assert answer.status_code == 200, answer.text
    sent = events(answer.text)
    shown = [
        (e["type"], e.get("index"), (e.get("content_block") or e.get("delta") or {}).get("type"))
        for e in sent
        if e["type"].startswith("content_block")
    ]
    thinking = [("content_block_delta", 0, "thinking_delta")] * len(THOUGHTS)
    texts = [("content_block_delta", 1, "text_delta")] * len(WORDS)
    assert shown == [
        ("content_block_start", 0, "thinking"),
        *thinking,
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        *texts,
        ("content_block_stop", 1, None),
    ]
    assert streamed_blocks(answer.text) == [
        {"type": "thinking", "thinking": THOUGHT, "signature": SEAL.sign(THOUGHT)},
        {"type": "text", "text": "".join(WORDS)},
    ]
    assert sent[-2]["usage"]["output_tokens"] == len(THOUGHTS) + len(WORDS)


@pytest.mark.parametrize("stream", [False, True])
def test_a_cache_hit_signs_as_the_live_answer(client: TestClient, stream: bool) -> None:
    sent = body("Cached?", temperature=0, stream=stream)
    live, hit = client.post(MESSAGES, json=sent), client.post(MESSAGES, json=sent)
    assert (live.headers["x-cache"], hit.headers["x-cache"]) == ("MISS", "HIT")
    if stream:
        blocks = [streamed_blocks(live.text), streamed_blocks(hit.text)]
    else:
        blocks = [live.json()["content"], hit.json()["content"]]
    assert blocks[0] == blocks[1]
    signed = {"type": "thinking", "thinking": THOUGHT, "signature": SEAL.sign(THOUGHT)}
    assert blocks[0][0] == signed


def next_turn(thinking: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A second turn whose assistant turn holds `thinking` blocks, then text."""
    turns = [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": [*thinking, {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Again."},
    ]
    return body(messages=turns, **extra)


def test_a_signed_thinking_block_comes_back_as_the_turns_reasoning(
    client: TestClient, engine: FakeEngine
) -> None:
    first = client.post(MESSAGES, json=body()).json()["content"][0]
    # One signed under an earlier key (`REASONING_PREVIOUS_KEYS`) is still the gateway's.
    earlier = ReasoningSeal([EARLIER.encode()]).sign(" Then again.")
    blocks = [first, {"type": "thinking", "thinking": " Then again.", "signature": earlier}]
    answer = client.post(MESSAGES, json=next_turn(blocks))
    assert answer.status_code == 200, answer.text
    chat = engine.prompts[-1].chat
    assert chat is not None
    assert chat.messages[1] == {
        "role": "assistant",
        "content": "Hello!",
        "reasoning": THOUGHT + " Then again.",
    }


@pytest.mark.parametrize(
    ("signature", "says"),
    [
        (SEAL.sign(THOUGHT)[:-2] + "AA", "signature is not this server's"),
        (ReasoningSeal([b"o" * 32]).sign(THOUGHT), "signature is not this server's"),
        (SEAL.sign("Another thought."), "signature is not this server's"),
        ("", "signature is not this server's"),
        (None, "needs the signature it was given"),
    ],
)
def test_a_thinking_block_not_signed_here_is_an_anthropic_400_before_any_engine_work(
    client: TestClient, engine: FakeEngine, signature: str | None, says: str
) -> None:
    block: dict[str, Any] = {"type": "thinking", "thinking": THOUGHT}
    if signature is not None:
        block["signature"] = signature
    signed = {"type": "thinking", "thinking": "Fine.", "signature": SEAL.sign("Fine.")}
    asked = len(engine.requests)
    answer = client.post(MESSAGES, json=next_turn([signed, block]))
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": answer.json()["error"]["message"]},
    }
    message = answer.json()["error"]["message"]
    assert "messages.1.content.1.signature" in message and says in message
    assert len(engine.requests) == asked


def test_thinking_blocks_of_a_body_converted_in_the_worker_process_are_verified(
    client: TestClient, engine: FakeEngine
) -> None:
    filler = [{"type": "text", "text": "word " * 40}] * 800
    signed = {"type": "thinking", "thinking": "Fine.", "signature": SEAL.sign("Fine.")}
    forged = {**signed, "signature": SEAL.sign("Not fine.")}
    for block, status in ((signed, 200), (forged, 400)):
        sent = next_turn([block], max_tokens=2048)
        sent["messages"][0]["content"] = filler
        payload = json.dumps(sent).encode()
        assert len(payload) > LARGE_BODY_BYTES
        answer = client.post(MESSAGES, content=payload, headers=JSON)
        assert answer.status_code == status, answer.text
    assert "messages.1.content.0.signature" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "says"),
    [
        ({"type": "enabled", "budget_tokens": 1000}, 2048, "greater than or equal to 1024"),
        ({"type": "enabled", "budget_tokens": 2048}, 2048, "less than max_tokens (2048)"),
        ({"type": "enabled"}, 2048, "Missing required parameter"),
    ],
)
def test_a_budget_out_of_bounds_is_an_anthropic_400_naming_it(
    client: TestClient, thinking: dict[str, Any], max_tokens: int, says: str
) -> None:
    answer = client.post(MESSAGES, json=body(thinking=thinking, max_tokens=max_tokens))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "'thinking.budget_tokens'" in error["message"] and says in error["message"]


@pytest.mark.parametrize(
    ("renders_chat", "parser", "budget"),
    [
        (True, False, 1024),  # an upstream: it decides, as its own /v1/messages would
        (True, True, None),  # an upstream the gateway splits: it has no parser to bound them
        (False, True, 1024),  # in process with a reasoning parser: vLLM bounds the thoughts
        (False, False, None),  # in process without one: vLLM would refuse; none sent
    ],
)
def test_the_budget_reaches_an_engine_that_can_take_it(
    renders_chat: bool, parser: bool, budget: int | None
) -> None:
    engine = FakeEngine(words=list(WORDS), renders_chat=renders_chat)
    engine.reasoning_parser = PassingParser() if parser else None
    with TestClient(fake_app(engine, max_model_len=4096)) as client:
        assert client.post(MESSAGES, json=body()).status_code == 200
    options = engine.requests[-1][2].reasoning
    assert (None if options is None else options.budget) == budget


@pytest.mark.parametrize(
    ("extra", "effort", "budget"),
    [
        ({"thinking": {"type": "disabled"}}, "none", None),
        ({"thinking": {"type": "adaptive"}}, None, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "high", None),
        ({"output_config": {"effort": "low"}}, "low", 1024),
    ],
)
def test_thinking_and_effort_reach_the_engine_and_its_template(
    client: TestClient,
    engine: FakeEngine,
    extra: dict[str, Any],
    effort: str | None,
    budget: int | None,
) -> None:
    assert client.post(MESSAGES, json=body(**extra)).status_code == 200
    options = engine.requests[-1][2].reasoning
    got = (None, None) if options is None else (options.effort, options.budget)
    assert got == (effort, budget)
    if effort == "none":
        assert options is not None and options.kwargs()["enable_thinking"] is False


def test_what_claude_code_sends_with_thinking_is_taken(
    client: TestClient, engine: FakeEngine
) -> None:
    cached = {"cache_control": {"type": "ephemeral"}}
    sent = body(
        stream=True,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=9a1f;"},
            {"type": "text", "text": "You are Claude Code.", **cached},
        ],
        tools=[{"name": "Read", "input_schema": {"type": "object", "properties": {}}, **cached}],
        metadata={"user_id": "user_" + "a" * 64 + "_account__session_" + "b" * 36},
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi.", **cached}]}],
    )
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
        "fine-grained-tool-streaming-2025-05-14",
        "x-app": "cli",
    }
    answer = client.post(MESSAGES, json=sent, headers=headers)
    assert answer.status_code == 200, answer.text
    assert streamed_blocks(answer.text)[0]["type"] == "thinking"
    chat = engine.prompts[-1].chat
    assert chat is not None
    # The billing header changes with every request: left out, as vLLM's server leaves it.
    assert chat.messages[0] == {"role": "system", "content": "You are Claude Code."}


def test_count_tokens_counts_thoughts_as_the_template_renders_them_without_verifying() -> None:
    engine = FakeEngine(words=list(WORDS), tokenizer=ThoughtCountingTokenizer())
    turns = next_turn([{"type": "thinking", "thinking": "Two and two.", "signature": "unsigned"}])
    bare = next_turn([])
    with TestClient(fake_app(engine, max_model_len=4096)) as client:
        counted = client.post(COUNT, json={k: turns[k] for k in ("model", "messages", "thinking")})
        without = client.post(COUNT, json={k: bare[k] for k in ("model", "messages")})
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == without.json()["input_tokens"] + 3
