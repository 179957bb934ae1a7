"""An upstream's tool calls, carried through the gateway's text-based tool pipeline.

The gateway renders tool calls from a choice's text, in the response format, so that a cache
hit renders the same calls as the run that made it (`wire.tool_calls`). An upstream sends
its calls already parsed; they are written into the text as records, `RS json RS` (RS is
U+001E, which JSON text never holds unescaped), and read back by `UpstreamToolParser`, the
upstream engine's tool parser. Content holding an RS is itself sent as a record. Records
are written only where the parser reads them (`reads_records`): elsewhere content goes as
it came, RS and all.
"""

from __future__ import annotations

import json
from typing import Any

from sluicegate.engine.protocol import (
    ChatPrompt,
    ParsedDelta,
    ParsedToolCall,
    ParsedToolCalls,
    ToolCallFragment,
    Tools,
)

RS = "\x1e"


def reads_records(chat: ChatPrompt | None) -> bool:
    """Whether the gateway reads this run's text with `UpstreamToolParser`: a chat offering
    tools with a `tool_choice` other than none (`wire.tool_calls.tool_stream`, with a parser
    that `reads_forced`). Only then may the text hold records; otherwise nothing would
    unwrap them, and the client would get them as they are."""
    return chat is not None and bool(chat.tools) and chat.tool_choice != "none"


def encode_content(text: str) -> str:
    if RS not in text:
        return text
    return _record({"c": text})


def encode_call_fragment(index: int, name: str | None, arguments: str) -> str:
    fragment: dict[str, Any] = {"i": index, "a": arguments}
    if name:
        fragment["n"] = name
    return _record(fragment)


def _record(data: dict[str, Any]) -> str:
    return RS + json.dumps(data, separators=(",", ":")) + RS


class UpstreamToolParser:
    """`ToolCallParser` for the records above. The upstream applied `tool_choice` itself, so
    this parser reads the calls whatever the mode (`reads_forced`)."""

    name = "upstream"
    reads_forced = True

    def extract(self, text: str, tools: Tools) -> ParsedToolCalls:
        stream = UpstreamCallStream()
        parsed = stream.feed(text)
        content = parsed.content
        calls: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        for fragment in parsed.calls:
            calls.setdefault(fragment.index, []).append(fragment.arguments)
            if fragment.name:
                names.setdefault(fragment.index, fragment.name)
        found = tuple(ParsedToolCall(names.get(i, ""), "".join(calls[i])) for i in sorted(calls))
        return ParsedToolCalls(content, found)

    def stream(self, tools: Tools) -> UpstreamCallStream:
        return UpstreamCallStream()


class UpstreamCallStream:
    """Reads records as text comes, holding an unfinished one back."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> ParsedDelta:
        text = self._pending + text
        self._pending = ""
        content: list[str] = []
        calls: list[ToolCallFragment] = []
        position = 0
        while True:
            start = text.find(RS, position)
            if start < 0:
                content.append(text[position:])
                break
            content.append(text[position:start])
            end = text.find(RS, start + 1)
            if end < 0:
                self._pending = text[start:]
                break
            record = _parse(text[start + 1 : end])
            if "c" in record:
                content.append(str(record["c"]))
            elif "i" in record:
                calls.append(
                    ToolCallFragment(int(record["i"]), record.get("n"), str(record.get("a", "")))
                )
            position = end + 1
        joined = "".join(content)
        return ParsedDelta(joined or None, tuple(calls))


def _parse(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {"c": raw}
    return value if isinstance(value, dict) else {"c": raw}
