"""A kept body, filled for another hit, equals a fresh rendering but for its id and time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob
from sluicegate.wire.body_template import BodyTemplate
from sluicegate.wire.completion import Collector, Completion
from sluicegate.wire.events import render_cached
from sluicegate.wire.formats import ResponseFormat, chat_format, completion_format
from sluicegate.wire.tools import ToolSetup


def completion(logprobs: bool = False) -> Completion:
    """Two choices, with text that looks like the envelope's fields."""
    collector = Collector([0, 1])
    for index in (0, 1):
        for text in ('"id":"x", "created":1', " and \u00e9\n", "done"):
            lp = [TokenLogprob(text, -0.5, (("alt", -1.0),))] if logprobs else None
            collector.add(ChoiceDelta(index, text, 1, None, lp))
        collector.add(ChoiceDelta(index, "", 0, "stop"))
    return collector.completion(7)


def without_identity(body: bytes, stream: bool) -> tuple[list[Any], set[str], set[int]]:
    """The body's JSON documents without `id` and `created`, and the values those had."""
    docs = (
        [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: {")]
        if stream
        else [body.decode()]
    )
    parsed = [json.loads(doc) for doc in docs]
    ids = {doc.pop("id") for doc in parsed}
    created = {doc.pop("created") for doc in parsed}
    return parsed, ids, created


FORMATS = {
    "chat": lambda usage: chat_format("m", usage),
    "completions": lambda usage: completion_format("m", usage),
}


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("logprobs", [False, True])
def test_a_filled_template_renders_like_the_format_with_a_new_id(
    kind: str, stream: bool, usage: bool, logprobs: bool
) -> None:
    fmt: ResponseFormat = FORMATS[kind](usage)
    answer, template = BodyTemplate.of(fmt, completion(logprobs), stream, usage)
    assert template is not None
    expected = render_cached(fmt.renewed(), completion(logprobs), stream, usage)
    docs, ids, _ = without_identity(answer.body, stream)
    assert docs == without_identity(expected.body, stream)[0]
    (first, headers), (second, _) = template.fill(), template.fill()
    for filled in (first, second):
        filled_docs, filled_ids, filled_created = without_identity(filled, stream)
        assert filled_docs == docs
        assert len(filled_ids) == 1 and filled_ids != ids
        assert len(filled_created) == 1
    expected_headers = dict(expected.headers)
    if not stream:
        expected_headers["content-length"] = str(len(first))
    assert {k.decode(): v.decode() for k, v in headers} == expected_headers
    assert without_identity(first, stream)[1] != without_identity(second, stream)[1]
    if stream:
        assert first.endswith(b"data: [DONE]\n\n")


def test_formats_whose_renderings_carry_ids_of_their_own_are_not_kept() -> None:
    tools = ToolSetup(({"type": "function", "function": {"name": "f"}},), "required")
    fmt = chat_format("m", False, tools)
    answer, template = BodyTemplate.of(fmt, completion(), False, False)
    assert template is None
    assert json.loads(answer.body)["object"] == "chat.completion"
