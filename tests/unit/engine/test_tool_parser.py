"""Our adapter over vLLM's registered tool parsers (the real `hermes` one)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluicegate.engine.model import bundled_model_dir
from sluicegate.engine.tool_parser import ToolParserError, VLLMToolCallParser
from sluicegate.settings import Settings

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]
TEXT = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


@pytest.fixture(scope="module")
def parser() -> VLLMToolCallParser:
    from transformers import AutoTokenizer

    hf: Any = AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))
    return VLLMToolCallParser("hermes", hf)


def test_whole_text_gives_the_calls_and_the_text_before(parser: VLLMToolCallParser) -> None:
    found = parser.extract(TEXT, TOOLS)
    assert found.content == "Sure.\n"
    assert [(c.name, json.loads(c.arguments)) for c in found.calls] == [
        ("get_weather", {"city": "Rome"})
    ]
    plain = parser.extract("No call here.", TOOLS)
    assert (plain.content, plain.calls) == ("No call here.", ())


def test_streaming_adds_up_to_the_same_call(parser: VLLMToolCallParser) -> None:
    stream = parser.stream(TOOLS)
    content, names, arguments = "", [], ""
    for i in range(0, len(TEXT), 3):
        delta = stream.feed(TEXT[i : i + 3])
        content += delta.content or ""
        for fragment in delta.calls:
            assert fragment.index == 0
            if fragment.name:
                names.append(fragment.name)
            arguments += fragment.arguments
    assert names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Rome"}
    assert content == "Sure.\n"


def test_an_unknown_parser_name_is_one_clear_error() -> None:
    with pytest.raises(ToolParserError, match=r"unknown tool call parser 'nope'.*hermes"):
        VLLMToolCallParser("nope", object())
