"""`HermesStream` against vLLM's own hermes parser: the same deltas, in linear work."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from sluicegate.engine import hermes_stream
from sluicegate.engine.hermes_stream import HermesStream
from sluicegate.engine.model import bundled_model_dir
from sluicegate.engine.protocol import ParsedDelta
from sluicegate.engine.tool_parser import VLLMToolCallParser, _request, _WholeText
from sluicegate.settings import Settings

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]
PIECES = [
    "<tool_call>", "</tool_call>", "<tool_", "</tool_", "<", "</", "<tool_call", "</tool_call",
    "{", "}", "[", "]", '"', "\\", '\\"', ":", ",", " ", "  ", "\n", "\t", "\x1c", "\u2028",
    "\u3000", '"name"', '"arguments"', '"name": ', '"arguments": ', '"name": "get_weather"',
    '"name":""', '"arguments": {"city": "Rome"}', '{"name": "f", "arguments": {}}', "1",
    "null", "Sure.", "a", "é", '{"x": "}"}', '"n', "ame", "argu", 'ments"',
]  # fmt: skip
"""What the random texts are made of: tags whole and cut, JSON marks, keys, white space
(U+001C is white space to `str.strip` but not to vLLM's patterns)."""


@pytest.fixture(scope="module")
def parser() -> VLLMToolCallParser:
    from transformers import AutoTokenizer

    hf: Any = AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))
    return VLLMToolCallParser("hermes", hf)


def vllms(parser: VLLMToolCallParser) -> _WholeText:
    """vLLM's hermes parser streaming as it does in vLLM: handed the whole text each time."""
    request = _request(TOOLS)
    return _WholeText(parser._cls(parser._tokenizer, request.tools), request)


def a_call(rng: random.Random) -> str:
    space = lambda: rng.choice(["", " ", "\n", "  \n"])  # noqa: E731
    arguments = rng.choice(['{"city": "Rome"}', "{}", '{"a": [1, {"b": "}]"}], "c": "\\""}'])
    fields = [f'"name":{space()}"get_weather"', f'"arguments":{space()}{arguments}']
    if rng.random() < 0.3:
        fields.reverse()
    body = "{" + space() + f",{space()}".join(fields) + space() + "}"
    return f"<tool_call>{space()}{body}{space()}</tool_call>"


def random_texts(rng: random.Random) -> Iterator[str]:
    for _ in range(600):  # pieces in any order
        yield "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40)))
    for _ in range(600):  # what a model writes: text, calls, text between, the last cut short
        parts = [rng.choice(["", "Sure.\n", "Let me check <b>it</b>. "])]
        parts += [a_call(rng) + rng.choice(["", "\n", " and "]) for _ in range(rng.randint(1, 3))]
        text = "".join(parts)
        yield text[: rng.randint(len(text) // 2, len(text))] if rng.random() < 0.3 else text


def cut(rng: random.Random, text: str) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        size = rng.choice([1, 1, 2, 3, 5, 8, 40])
        pieces.append(text[i : i + size])
        i += size
    return pieces


def test_each_delta_is_the_one_vllms_parser_sends(parser: VLLMToolCallParser) -> None:
    rng = random.Random(28)
    for text in random_texts(rng):
        deltas = cut(rng, text)
        ours, theirs = HermesStream(), vllms(parser)
        for i, delta in enumerate(deltas):
            expected = theirs.feed(delta)
            assert ours.feed(delta) == expected, (text, deltas[: i + 1])


def test_a_call_streams_its_name_then_its_arguments() -> None:
    stream = HermesStream()
    fed = ["Sure.", " <tool", '_call>\n{"name": "get_weather", "arg', 'uments": {"city": ']
    fed += ['"Rome"}', "}\n</tool_call>"]
    deltas = [stream.feed(piece) for piece in fed]
    assert [d.content for d in deltas] == ["Sure.", " ", None, None, None, None]
    assert [(c.index, c.name, c.arguments) for d in deltas for c in d.calls] == [
        (0, "get_weather", ""),
        (0, None, '{"city":'),  # the space waits: it could end the region
        (0, None, ' "Rome"}'),
    ]


SHAPES = {
    "text": lambda i: "a <b> " if i % 2 else "<tool ",
    "long arguments": lambda i: '<tool_call>{"name": "f", "arguments": {"x": "' if i == 0 else "ab",
    "name last": lambda i: '<tool_call>{"arguments": {"x": ' if i == 0 else "[1], ",
    "many calls": lambda i: '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n',
    "space before a cut tag": lambda i: "<tool_call>{" if i == 0 else ("  " if i % 3 else "</"),
}
"""Outputs written one small delta at a time, by the delta's number."""


def characters_read(monkeypatch: pytest.MonkeyPatch, parser: VLLMToolCallParser) -> list[int]:
    """A counter of the characters the streams look at: what the hermes stream reads back
    from its text, and the whole texts handed to vLLM's parser."""
    count = [0]
    read = hermes_stream._Text.slice
    vllm_feed = type(vllms(parser)._parser).extract_tool_calls_streaming

    def counted_read(self: Any, start: int, stop: int) -> str:
        piece = read(self, start, stop)
        count[0] += len(piece)
        return piece

    def counted_feed(self: Any, previous: str, current: str, *args: Any) -> Any:
        count[0] += len(current)
        return vllm_feed(self, previous, current, *args)

    monkeypatch.setattr(hermes_stream._Text, "slice", counted_read)
    monkeypatch.setattr(type(vllms(parser)._parser), "extract_tool_calls_streaming", counted_feed)
    return count


@pytest.mark.parametrize("shape", SHAPES)
def test_the_work_grows_with_the_output_not_its_square(
    parser: VLLMToolCallParser, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    count = characters_read(monkeypatch, parser)
    work = {}
    for deltas in (4_000, 16_000):
        stream = parser.stream(TOOLS)
        count[0], fed = 0, 0
        for i in range(deltas):
            piece = SHAPES[shape](i)
            fed += len(piece)
            assert isinstance(stream.feed(piece), ParsedDelta)
        work[deltas] = count[0]
        # Each character is read a few times (found, scanned, sent), each delta looks back
        # a tag's length or two; vLLM's parser read the whole text on every delta.
        assert count[0] <= 4 * fed + 40 * deltas, (deltas, count[0], fed)
    assert work[16_000] <= 4.5 * work[4_000], work
