"""From a completion's text to OpenAI's `tool_calls`, whole or as stream deltas.

This lives in the response format (`formats.ChatFormat`), not in the service: cached
completions are stored as text and rendered through the request's format, so a hit gives
the same calls (with new ids) as the run that made it.

- `required`: the output is constrained to `[{"name": ..., "arguments": {...}}, ...]`;
  `CallScanner` reads it as it comes (a small string-aware JSON scanner), so arguments stream
  as they are written, no parser needed.
- named: the output is the arguments object itself.
- `auto`: the model's own format, read by the configured tool parser (`engine.tool_parser`).
  Streams use the parser's streaming method; at the end, what it missed is sent from the
  whole-text parse, so a stream adds up to the same calls as the JSON answer.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from sluicegate.engine.protocol import ToolCallParser
from sluicegate.wire.tools import ToolSetup

_WHITESPACE = " \t\n\r"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class CallDelta:
    """One `delta.tool_calls` entry: the call's opening (id and name, empty arguments), or
    a fragment of its arguments."""

    index: int
    arguments: str = ""
    name: str | None = None
    id: str | None = None

    def wire(self) -> dict[str, object]:
        if self.name is not None:
            return {
                "index": self.index,
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass(slots=True)
class Rendered:
    """What a piece of output comes to: text content, call deltas, or both."""

    content: str | None = None
    calls: list[CallDelta] = field(default_factory=list)


@dataclass(slots=True)
class _Call:
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    sent: int = 0
    """Argument characters sent so far."""
    opened: bool = False
    id: str = field(default_factory=call_id)


class ToolStream:
    """One choice's output turned into content and call deltas as it comes (`feed`), and
    closed (`finish`). `calls()` and `content()` give the whole result."""

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._content: list[str] = []

    def feed(self, text: str) -> Rendered:
        raise NotImplementedError

    def finish(self) -> Rendered:
        return Rendered(calls=self._pending())

    def calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments) of every call opened."""
        return [(c.id, c.name or "", "".join(c.arguments)) for c in self._calls if c.opened]

    def content(self) -> str | None:
        return "".join(self._content) or None

    @property
    def called(self) -> bool:
        return any(c.opened for c in self._calls)

    def _pending(self) -> list[CallDelta]:
        """Openings of calls whose name is now known, and argument text not yet sent."""
        deltas: list[CallDelta] = []
        for index, call in enumerate(self._calls):
            if call.name is None:
                break  # calls open in order
            if not call.opened:
                call.opened = True
                deltas.append(CallDelta(index, "", call.name, call.id))
            arguments = "".join(call.arguments)
            if len(arguments) > call.sent:
                deltas.append(CallDelta(index, arguments[call.sent :]))
                call.sent = len(arguments)
        return deltas


class NamedStream(ToolStream):
    """The output is the arguments of one call to a known function. Whitespace around the
    object is not part of them (held back until more text follows)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._calls.append(_Call(name))
        self._held = ""

    def feed(self, text: str) -> Rendered:
        call = self._calls[0]
        text = self._held + text
        if not call.arguments:
            text = text.lstrip(_WHITESPACE)
        body = text.rstrip(_WHITESPACE)
        self._held = text[len(body) :]
        if body:
            call.arguments.append(body)
        if not call.arguments:
            # The call opens with its first argument text: a delta with none (the thoughts
            # before it, split off) must not open it ahead of them.
            return Rendered()
        return Rendered(calls=self._pending())


class CallScanner(ToolStream):
    """Reads `[{"name": "f", "arguments": {...}}, ...]` as it is written.

    Tracks only what it needs: string and escape state, container depth, and the key each
    value at the call objects' level belongs to. A call opens once its name is complete; its
    `arguments` value is passed on verbatim, as it comes."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._key: list[str] | None = None
        self._field: str | None = None
        """The call object's key whose value is being read."""
        self._expect = "key"  # at depth 2: key, colon, value, after
        self._value_open = False
        self._scalar = False
        self._name: list[str] = []

    def feed(self, text: str) -> Rendered:
        for char in text:
            self._step(char)
        return Rendered(calls=self._pending())

    def _step(self, char: str) -> None:
        if self._in_string:
            closing = char == '"' and not self._escape
            self._escape = char == "\\" and not self._escape
            if not closing:
                if self._key is not None:
                    self._key.append(char)
                self._capture(char)
                return
            self._in_string = False
            if self._key is not None:
                self._field = _loads_str('"' + "".join(self._key) + '"')
                self._key = None
                self._expect = "colon"
                return
            self._capture(char)
            if self._depth == 2 and self._value_open:
                self._end_value()
            return
        if self._scalar and (char in ",}" or char in _WHITESPACE):
            self._end_value()
        depth = self._depth
        if depth == 2 and not self._value_open:
            self._between_fields(char)
            return
        if char == '"':
            self._in_string = True
        elif char in "[{":
            self._depth += 1
            if depth == 1 and char == "{":
                self._calls.append(_Call())
                self._expect = "key"
        elif char in "]}":
            self._depth -= 1
        self._capture(char)
        if char in "]}" and self._depth == 2 and self._value_open:
            self._end_value()

    def _between_fields(self, char: str) -> None:
        if char in _WHITESPACE:
            return
        if self._expect == "key" and char == '"':
            self._in_string = True
            self._key = []
        elif self._expect == "colon" and char == ":":
            self._expect = "value"
        elif self._expect == "value":
            self._value_open = True
            self._name = []
            if char == '"':
                self._in_string = True
            elif char in "[{":
                self._depth += 1
            else:
                self._scalar = True
            self._capture(char)
        elif char == ",":
            self._expect = "key"
        elif char == "}":
            self._depth -= 1

    def _capture(self, char: str) -> None:
        if not self._value_open or not self._calls:
            return
        if self._field == "arguments":
            self._calls[-1].arguments.append(char)
        elif self._field == "name":
            self._name.append(char)

    def _end_value(self) -> None:
        if self._field == "name" and self._calls:
            name = _loads_str("".join(self._name))
            if name is not None:
                self._calls[-1].name = name
        self._value_open = self._scalar = False
        self._field = None
        self._expect = "after"


class AutoStream(ToolStream):
    """The model's own tool-call format, read by the configured parser."""

    def __init__(self, parser: ToolCallParser, setup: ToolSetup) -> None:
        super().__init__()
        self._parser = parser
        self._setup = setup
        self._stream = parser.stream(setup.tools)
        self._text: list[str] = []
        self._parsed_content: str | None = None
        # `parallel_tool_calls: false`: the first call only (the model may write more).
        self._most = None if setup.parallel else 1

    def feed(self, text: str) -> Rendered:
        self._text.append(text)
        parsed = self._stream.feed(text)
        for fragment in parsed.calls:
            if self._most is not None and fragment.index >= self._most:
                continue
            while len(self._calls) <= fragment.index:
                self._calls.append(_Call())
            call = self._calls[fragment.index]
            if fragment.name is not None and call.name is None:
                call.name = fragment.name
            if fragment.arguments:
                call.arguments.append(fragment.arguments)
        if parsed.content:
            self._content.append(parsed.content)
        return Rendered(parsed.content, self._pending())

    def adopt(self, text: str) -> None:
        """Take the whole-text parse of `text` as the result (a JSON answer)."""
        found = self._parser.extract(text, self._setup.tools)
        self._content = [found.content] if found.content else []
        self._calls = [
            _Call(c.name, [c.arguments], len(c.arguments), True) for c in found.calls[: self._most]
        ]

    def finish(self) -> Rendered:
        """What the whole-text parse finds that the stream has not sent: text it held back,
        calls or argument text it missed."""
        whole = self._parser.extract("".join(self._text), self._setup.tools)
        rendered = Rendered()
        if not whole.calls:
            sent = "".join(self._content)
            if whole.content and whole.content.startswith(sent) and len(whole.content) > len(sent):
                rendered.content = whole.content[len(sent) :]
                self._content.append(rendered.content)
        for index, parsed in enumerate(whole.calls[: self._most]):
            while len(self._calls) <= index:
                self._calls.append(_Call())
            call = self._calls[index]
            if call.name is None:
                call.name = parsed.name
            streamed = "".join(call.arguments)
            if parsed.arguments.startswith(streamed):
                call.arguments = [parsed.arguments]
        rendered.calls = self._pending()
        return rendered


class TextStream(ToolStream):
    """No tool calls to look for (`none`, or `auto` without a parser)."""

    def feed(self, text: str) -> Rendered:
        self._content.append(text)
        return Rendered(text)


def tool_stream(setup: ToolSetup, parser: ToolCallParser | None) -> ToolStream:
    if setup.mode != "none" and parser is not None and parser.reads_forced:
        return AutoStream(parser, setup)
    if setup.mode == "required":
        return CallScanner()
    if setup.mode == "named" and setup.function is not None:
        return NamedStream(setup.function)
    if setup.mode == "auto" and parser is not None:
        return AutoStream(parser, setup)
    return TextStream()


def whole_calls(setup: ToolSetup, parser: ToolCallParser | None, text: str) -> ToolStream:
    """A tool stream fed the whole text and finished: for a JSON answer."""
    stream = tool_stream(setup, parser)
    if isinstance(stream, AutoStream):
        stream.adopt(text)  # one parse of the whole text, as vLLM's server does
        return stream
    stream.feed(text)
    stream.finish()
    return stream


def _loads_str(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
