"""vLLM's tool parsers behind our `ToolCallParser` protocol: the one place that knows them.

A parser is picked by name from vLLM's registry (`--tool-call-parser` in vLLM's server:
hermes, llama3_json, pythonic, ...). Its module paths and request types change between vLLM
releases; only this module imports them. Parsers look at a vLLM `ChatCompletionRequest` (for
the tools offered), built here from our tools. Streaming parsers are fed text only: the cache
replays text, so anything keyed on token ids would render a hit differently.
"""

from __future__ import annotations

import logging
from typing import Any

from sluicegate.engine.hermes_stream import HermesStream
from sluicegate.engine.protocol import (
    ParsedDelta,
    ParsedToolCall,
    ParsedToolCalls,
    ToolCallFragment,
    ToolCallStream,
    Tools,
)

logger = logging.getLogger(__name__)


class ToolParserError(Exception):
    """The configured parser cannot be used; one line for the operator."""


def tool_parser_names() -> list[str]:
    from vllm.tool_parsers import ToolParserManager

    return list(ToolParserManager.list_registered())


class VLLMToolCallParser:
    """`ToolCallParser` over one of vLLM's registered tool parsers."""

    reads_forced = False

    def __init__(self, name: str, tokenizer: Any):
        from vllm.tool_parsers import ToolParserManager

        try:
            self._cls = ToolParserManager.get_tool_parser(name)
        except KeyError:
            known = ", ".join(tool_parser_names())
            raise ToolParserError(f"unknown tool call parser {name!r} (known: {known})") from None
        self.name = name
        self._tokenizer = tokenizer

    def extract(self, text: str, tools: Tools) -> ParsedToolCalls:
        request = _request(tools)
        parser = self._cls(self._tokenizer, request.tools)
        try:
            info = parser.extract_tool_calls(text, request)
        except Exception:  # a parser's bug must not turn an answer into a 500
            logger.exception("tool parser %s failed; answering with the text", self.name)
            return ParsedToolCalls(text)
        if not info.tools_called:
            return ParsedToolCalls(text)
        calls = tuple(
            ParsedToolCall(c.function.name, c.function.arguments) for c in info.tool_calls
        )
        return ParsedToolCalls(info.content or None, calls)

    def stream(self, tools: Tools) -> _Stream:
        from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

        if self._cls is Hermes2ProToolParser:  # exactly: subclasses change the tags
            return _Stream(HermesStream(), self.name)
        request = _request(tools)
        return _Stream(_WholeText(self._cls(self._tokenizer, request.tools), request), self.name)


class _Stream:
    """A stream whose parser's failure ends its calls, not the answer."""

    def __init__(self, reader: ToolCallStream, name: str):
        self._reader = reader
        self._name = name
        self._failed = False

    def feed(self, text: str) -> ParsedDelta:
        if self._failed or not text:
            return ParsedDelta()
        try:
            return self._reader.feed(text)
        except Exception:
            logger.exception("tool parser %s failed while streaming", self._name)
            self._failed = True
            return ParsedDelta()


class _WholeText:
    """A vLLM parser's own streaming: handed the whole text so far on each delta, so its work
    grows with the square of the output (hermes has `HermesStream` instead)."""

    def __init__(self, parser: Any, request: Any):
        self._parser = parser
        self._request = request
        self._text = ""

    def feed(self, text: str) -> ParsedDelta:
        previous, self._text = self._text, self._text + text
        delta = self._parser.extract_tool_calls_streaming(
            previous, self._text, text, [], [], [], self._request
        )
        if delta is None:
            return ParsedDelta()
        fragments = []
        for call in delta.tool_calls or ():
            function = call.function
            if isinstance(function, dict):
                name, arguments = function.get("name"), function.get("arguments")
            elif function is not None:
                name, arguments = function.name, function.arguments
            else:
                name = arguments = None
            fragments.append(ToolCallFragment(call.index, name, arguments or ""))
        return ParsedDelta(delta.content or None, tuple(fragments))


def _request(tools: Tools) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    data = {"model": "", "messages": [], "tools": [dict(t) for t in tools], "tool_choice": "auto"}
    return ChatCompletionRequest.model_validate(data)
