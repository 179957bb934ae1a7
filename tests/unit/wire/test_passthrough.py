"""Pass-through: the upstream reader's raw mode (engine/upstream/wire.py) and
`PassThroughWriter`, on events written as vLLM's server (compact) and llama.cpp's Python
server (spaced) write them. The byte-for-byte comparison with the rendered path over HTTP is
tests/integration/test_upstream_passthrough.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluicegate.engine.protocol import ChoiceDelta, EngineStep
from sluicegate.engine.upstream.wire import StreamReader, UpstreamStreamError
from sluicegate.errors import EngineUnavailableError
from sluicegate.wire.formats import ChatFormat, CompletionFormat
from sluicegate.wire.passthrough import PassThroughWriter, passes_through
from sluicegate.wire.tools import ToolSetup


def _chunk(content: str | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def _line(event: dict[str, Any], spaced: bool = False) -> str:
    if spaced:
        return "data: " + json.dumps(event)
    return "data: " + json.dumps(event, separators=(",", ":"))


USAGE = {**_chunk(None), "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}


def _read(lines: list[str]) -> list[EngineStep]:
    reader = StreamReader(choices=1, raw=True)
    steps = [s for s in (reader.feed_lines([line]) for line in lines) if s is not None]
    return [*steps, reader.finish()]


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
def test_the_reader_hands_each_chunk_on_and_counts_as_the_parser_would(spaced: bool) -> None:
    lines = [
        _line(_chunk(""), spaced),
        _line(_chunk("Hel"), spaced),
        _line(_chunk("lo"), spaced),
        _line(_chunk(None, "stop"), spaced),
        _line(USAGE, spaced),
        "data: [DONE]",
    ]
    steps = _read(lines)
    deltas = [d for s in steps for d in s.choices]
    assert all(d.raw is not None and d.text == "" for d in deltas)
    # Every chunk with choices, as it came, in order; the usage event is the gateway's own.
    assert "".join(d.raw or "" for d in deltas) == "".join(f"{line}\n\n" for line in lines[:4])
    assert deltas[-1].finish_reason == "stop"
    assert sum(d.num_tokens for d in deltas) == 3  # settled on the usage's completion tokens
    assert steps[-1].prompt_tokens == 4


def test_the_reader_raises_an_upstream_error_event() -> None:
    reader = StreamReader(choices=1, raw=True)
    reader.feed_lines([_line(_chunk("a"))])
    with pytest.raises(UpstreamStreamError, match="overloaded"):
        reader.feed_lines(['data: {"error":{"message":"overloaded"}}'])


def _writer(include_usage: bool, model: str = "house") -> PassThroughWriter:
    return PassThroughWriter(ChatFormat("chatcmpl-ours", 99, model, include_usage))


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_the_writer_puts_the_runs_envelope_in(spaced: bool, include_usage: bool) -> None:
    writer = _writer(include_usage)
    raw = "".join(f"{_line(_chunk(t, usage=None), spaced)}\n\n" for t in ("a", "b"))
    out = b"".join(writer.events(ChoiceDelta(0, "", 2, raw=raw))).decode()
    events = [json.loads(e[6:]) for e in out.split("\n\n") if e]
    assert [e["id"] for e in events] == ["chatcmpl-ours"] * 2
    assert [e["created"] for e in events] == [99, 99]
    assert [e["model"] for e in events] == ["house"] * 2
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["a", "b"]
    assert all(("usage" in e) is include_usage for e in events)
    assert "up-model" not in out and "chatcmpl-up" not in out
    assert writer.completion(5).completion_tokens == 2


def test_the_writer_renders_a_delta_without_events_into_the_same_choice() -> None:
    writer = _writer(False)
    opened = b"".join(writer.events(ChoiceDelta(0, "", 0, raw=f"{_line(_chunk(''))}\n\n")))
    rendered = b"".join(writer.events(ChoiceDelta(0, "x", 1, "stop"))).decode()
    assert b'"role"' not in rendered.encode()  # the choice was opened by the upstream's chunk
    assert opened.count(b"data: ") == 1
    contents = [json.loads(e[6:])["choices"][0]["delta"] for e in rendered.split("\n\n") if e]
    assert contents == [{"content": "x"}, {}]


def test_an_aborted_choice_passed_through_is_an_engine_failure() -> None:
    writer = _writer(False)
    with pytest.raises(EngineUnavailableError):
        list(writer.events(ChoiceDelta(0, "", 0, "abort", raw=f"{_line(_chunk(None))}\n\n")))


def test_only_plain_chats_and_text_completions_pass_through() -> None:
    assert passes_through(ChatFormat("c", 1, "m", False))
    assert passes_through(CompletionFormat("c", 1, "m", False))
    tools = ToolSetup(tools=({"type": "function", "function": {"name": "f"}},), mode="auto")
    assert not passes_through(ChatFormat("c", 1, "m", False, tools))


def _passed_on(lines: list[str]) -> list[str]:
    """What the client gets of `lines` passed through: the writer's bytes, as the events an
    SSE parser reads in them (any of CR, LF, CRLF ends a line)."""
    writer = _writer(False)
    out = b"".join(
        b"".join(writer.events(d)) for s in _read(lines) for d in s.choices if d.raw is not None
    ).decode()
    assert out.endswith("\n\n")
    return [e for e in out.replace("\r\n", "\n").replace("\r", "\n").split("\n\n") if e]


def test_a_bare_cr_within_an_event_reaches_the_client_as_one_event() -> None:
    """JSON may hold a CR between tokens; handed on as it came, the client's SSE parser
    would split the event there (a line of half an object, then a line of the rest)."""
    lines = [
        'data: {"id":"chatcmpl-up","created":1,\r"model":"up-model","choices":[{"index":0,'
        '"delta":{"content":"a"},\r"finish_reason":null}]}',
        _line(_chunk("b")),
    ]
    events = _passed_on(lines)
    assert [e.count("\n") for e in events] == [0, 0]
    parsed = [json.loads(e.removeprefix("data: ")) for e in events]
    assert [p["choices"][0]["delta"]["content"] for p in parsed] == ["a", "b"]
    assert [p["id"] for p in parsed] == ["chatcmpl-ours"] * 2


def test_an_event_cut_by_a_crlf_within_it_is_not_handed_on_in_pieces() -> None:
    """An upstream line end (CRLF) inside an event: the reader sees its first half as the
    event (the rest is not a `data:` line). Handed on, the client would get half an object;
    it is parsed instead, and fails as a broken event does."""
    head = 'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],'
    reader = StreamReader(choices=1, raw=True)
    with pytest.raises(ValueError):
        reader.feed_lines([head + "\r", '"id":"chatcmpl-up"}'])


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 4, "completion_tokens": -1000},
        {"prompt_tokens": -4, "completion_tokens": 2},
        {"prompt_tokens": 4, "completion_tokens": 10**15},
        {"prompt_tokens": 4, "completion_tokens": 2.5},
        {"prompt_tokens": 4, "completion_tokens": "2"},
    ],
    ids=["negative-completion", "negative-prompt", "absurd", "fraction", "text"],
)
def test_a_usage_that_cannot_be_is_not_believed(usage: dict[str, Any]) -> None:
    """Negative counts would be refunds to the key's budget, absurd ones charges: the
    gateway's own count (a token per chunk with text) stands, and no prompt count."""
    lines = [
        _line(_chunk("a")),
        _line(_chunk("b")),
        _line(_chunk(None, "stop")),
        _line({**USAGE, "usage": usage}),
        "data: [DONE]",
    ]
    for raw in (True, False):
        reader = StreamReader(choices=1, raw=raw, window=4096)
        steps = [s for s in (reader.feed_lines([line]) for line in lines) if s is not None]
        steps.append(reader.finish())
        assert sum(d.num_tokens for s in steps for d in s.choices) == 2
        assert all(d.num_tokens >= 0 for s in steps for d in s.choices)
        assert steps[-1].prompt_tokens == 0
