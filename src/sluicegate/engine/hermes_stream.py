"""vLLM's `hermes` tool parser, streamed in linear time.

vLLM's parser (`Hermes2ProToolParser.extract_tool_calls_streaming`) is handed the whole text
so far on every delta and scans all of it again: 4,000 deltas cost 30 ms of loop time and
16,000 cost 655 ms. `HermesStream` sends the same content and call fragments, delta for delta,
and looks at each character a bounded number of times: it keeps what it has found (where the
first `<tool_call>` is, each region's JSON depth, which keys matched) instead of finding it
again. Its rules are vLLM's:

- content is the text before the first `<tool_call>`, less a tail that could begin that tag;
- a region runs from `<tool_call>` to `</tool_call>` (or to the end, less a tail that could
  begin `</tool_call>`), stripped of white space;
- a region's name is the first `"name": "..."` in it; a region without a name holds back the
  regions after it (for good once it is closed);
- its arguments are the text after its first `"arguments":`, less the outer object's closing
  brace once the region is complete JSON, and what is sent is what is longer than before.

`tests/unit/engine/test_hermes_stream.py` holds it to vLLM's parser on random texts cut at
random places. One difference: JSON nested about a thousand deep makes vLLM's `json.loads`
raise on every delta, which drops that delta; here it only means "not complete yet".
"""

from __future__ import annotations

import bisect
import json
import re

from sluicegate.engine.protocol import ParsedDelta, ToolCallFragment

START = "<tool_call>"
END = "</tool_call>"

# vLLM's patterns are compiled with the `regex` module, whose `\s` is exactly these
# characters; `str.strip`, which it uses as well, also strips U+001C to U+001F.
_PATTERN_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_JSON_MARKS = re.compile(r'["\\{}\[\]]')


class _Text:
    """Append-only text whose slices cost what they return: the whole is never copied."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._starts: list[int] = []
        self.length = 0

    def append(self, chunk: str) -> None:
        self._starts.append(self.length)
        self._chunks.append(chunk)
        self.length += len(chunk)

    def slice(self, start: int, stop: int) -> str:
        start, stop = max(start, 0), min(stop, self.length)
        if start >= stop:
            return ""
        i = bisect.bisect_right(self._starts, start) - 1
        parts = []
        while i < len(self._chunks) and self._starts[i] < stop:
            offset = self._starts[i]
            parts.append(self._chunks[i][max(start - offset, 0) : stop - offset])
            i += 1
        return "".join(parts)

    def solid_end(self, stop: int, floor: int) -> int:
        """Where `text[floor:stop].rstrip()` ends (`floor` when it is all white space)."""
        while stop > floor:
            block = self.slice(max(floor, stop - 64), stop)
            kept = block.rstrip()
            if kept:
                return stop - len(block) + len(kept)
            stop -= len(block)
        return floor


def _overlap(text: str, tag: str) -> int:
    """The longest proper prefix of `tag` that `text` ends with."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class _KeyScan:
    """The first match of vLLM's `"key"\\s*:\\s*` in a region, fed one piece at a time: for
    `name` with its string value (`"([^"]+)"`), for `arguments` the first character after.

    A match can only start at a quote, and the pattern has no quote-free overlaps, so the
    attempts alive at once are few; each is `[state, value_start]`, the state counting the
    characters of `"key"` matched, then `_BEFORE` and `_AFTER` the colon, then `_VALUE`."""

    def __init__(self, key: str, string_value: bool) -> None:
        self._literal = f'"{key}"'
        self._string_value = string_value
        self._attempts: list[list[int]] = []
        self.found: tuple[int, int] | None = None
        """`name`: the value's start and end; `arguments`: where they start (twice)."""

    @property
    def _before(self) -> int:
        return len(self._literal)

    def feed(self, chunk: str, base: int) -> None:
        before, after, value = self._before, self._before + 1, self._before + 2
        i = 0
        while i < len(chunk) and self.found is None:
            if all(a[0] == value for a in self._attempts):  # only a quote changes anything
                i = chunk.find('"', i)
                if i < 0:
                    return
            char, pos = chunk[i], base + i
            alive = []
            for attempt in self._attempts:
                state = attempt[0]
                if state < before:
                    if char == self._literal[state]:
                        attempt[0] += 1
                        alive.append(attempt)
                elif state == before:
                    if char == ":":
                        attempt[0] = after
                        alive.append(attempt)
                    elif char in _PATTERN_SPACE:
                        alive.append(attempt)
                elif state == after:
                    if char in _PATTERN_SPACE:
                        alive.append(attempt)
                    elif not self._string_value:
                        self.found = (pos, pos)
                    elif char == '"':
                        alive.append([value, pos + 1])
                elif char != '"':
                    alive.append(attempt)
                elif pos > attempt[1]:
                    self.found = (attempt[1], pos)
                if self.found is not None:
                    return
            if char == '"':
                alive.append([1, 0])
            self._attempts = alive
            i += 1


class _Depth:
    """Where a region that opens with `{` first comes back to depth 0, strings skipped. Where
    `json.loads` takes a region ending in `}`, that is its last character, so `json.loads` is
    only tried there: once per region, not once per delta."""

    def __init__(self, opening: int) -> None:
        self._opening = opening
        self._depth = 1
        self._in_string = False
        self._escaped = -1
        self.close: int | None = None

    def feed(self, chunk: str, base: int) -> None:
        for mark in _JSON_MARKS.finditer(chunk):
            pos = base + mark.start()
            if pos <= self._opening or pos == self._escaped or self.close is not None:
                continue
            char = mark.group()
            if self._in_string:
                if char == "\\":
                    self._escaped = pos + 1
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.close = pos
                    return


class _Region:
    """One `<tool_call>` region: what has been found in it and what has been sent of it."""

    def __init__(self, index: int, start: int) -> None:
        self.index = index
        self.start = start
        self.end: int | None = None
        """Where `</tool_call>` starts, once it has come."""
        self.named = False
        self.sent = 0
        """How much of the arguments has been sent (vLLM's parser compares lengths only)."""
        self._fed = start
        self._lead: int | None = None
        self._solid = start
        self._depth: _Depth | None = None
        self._name = _KeyScan("name", string_value=True)
        self._arguments = _KeyScan("arguments", string_value=False)
        self._complete: tuple[int, bool] | None = None
        self._sendable: tuple[tuple[int, bool], int] | None = None

    def feed(self, text: _Text) -> None:
        stop = text.length if self.end is None else self.end
        if stop <= self._fed:
            return
        chunk, base = text.slice(self._fed, stop), self._fed
        self._fed = stop
        if self._lead is None:
            lead = len(chunk) - len(chunk.lstrip())
            if lead < len(chunk):
                self._lead = base + lead
                if chunk[lead] == "{":
                    self._depth = _Depth(self._lead)
        kept = chunk.rstrip()
        if kept:
            self._solid = base + len(kept)
        if self._depth is not None and self._depth.close is None:
            self._depth.feed(chunk, base)
        if self._name.found is None:
            self._name.feed(chunk, base)
        if self._arguments.found is None:
            self._arguments.feed(chunk, base)

    def name(self, text: _Text) -> str | None:
        found = self._name.found
        return None if found is None else text.slice(*found)

    @property
    def arguments_start(self) -> int:
        return -1 if self._arguments.found is None else self._arguments.found[0]

    def arguments_length(self, text: _Text) -> int:
        """How long vLLM's parser takes the arguments to be now (0: none yet)."""
        start = self.arguments_start
        end = self._json_end(text)
        if start < 0 or end <= start:
            return 0
        key = (end, self.end is not None)
        if self._sendable is not None and self._sendable[0] == key:
            return self._sendable[1]
        length = end - start
        if text.slice(end - 1, end) == "}" and self._is_complete(text, end):
            length = text.solid_end(end - 1, start) - start
        self._sendable = (key, length)
        return length

    def _json_end(self, text: _Text) -> int:
        """Where the region's JSON text, stripped, ends now (at its lead when it is empty)."""
        if self.end is not None:
            stop = self.end
        else:
            tail = text.slice(max(self.start, text.length - len(END) + 1), text.length)
            stop = text.length - _overlap(tail, END)
        if self._lead is None or self._lead >= stop:
            return -1
        return self._solid if self._solid <= stop else text.solid_end(stop, self._lead)

    def _is_complete(self, text: _Text, end: int) -> bool:
        if self.end is not None:
            return True
        if self._depth is None or self._depth.close != end - 1 or self._lead is None:
            return False
        if self._complete is None or self._complete[0] != end:
            try:
                json.loads(text.slice(self._lead, end))
                complete = True
            except (ValueError, RecursionError):
                complete = False
            self._complete = (end, complete)
        return self._complete[1]


class HermesStream:
    """`ToolCallStream` for the hermes format (`<tool_call>{"name": ..., "arguments": ...}
    </tool_call>`), as vLLM's hermes parser streams it."""

    def __init__(self) -> None:
        self._text = _Text()
        self._sent = 0
        self._first: int | None = None
        """Where the first `<tool_call>` starts: content ends there."""
        self._next = 0
        """Where the next `<tool_call>` may start (after the last `</tool_call>`)."""
        self._open: _Region | None = None
        self._regions = 0
        self._stuck = False
        """A closed region has no name: vLLM's parser sends nothing more, ever."""

    def feed(self, text: str) -> ParsedDelta:
        if self._stuck or not text:
            return ParsedDelta()
        before = self._text.length
        self._text.append(text)
        regions = self._regions_touched(before)
        content = self._content()
        return ParsedDelta(content, tuple(self._fragments(regions)))

    def _regions_touched(self, before: int) -> list[_Region]:
        """The open region and those `text` starts, with the tags in it found; only the last
        can still be open. Regions closed before have sent all they will."""
        base = max(0, before - len(END) + 1)  # a tag may have begun in the last 11 characters
        window = self._text.slice(base, self._text.length)
        touched = [] if self._open is None else [self._open]
        while True:
            region = self._open
            if region is not None:
                at = window.find(END, max(region.start, base) - base)
                if at < 0:
                    return touched
                region.end = base + at
                self._next = region.end + len(END)
                self._open = None
            else:
                at = window.find(START, max(self._next, base) - base)
                if at < 0:
                    return touched
                if self._first is None:
                    self._first = base + at
                self._open = _Region(self._regions, base + at + len(START))
                self._regions += 1
                touched.append(self._open)

    def _content(self) -> str | None:
        length = self._text.length
        if self._first is None:
            tail = self._text.slice(length - len(START) + 1, length)
            sendable = length - _overlap(tail, START)
        else:
            sendable = self._first
        if sendable <= self._sent:
            return None
        content = self._text.slice(self._sent, sendable)
        self._sent = sendable
        return content

    def _fragments(self, regions: list[_Region]) -> list[ToolCallFragment]:
        fragments = []
        for region in regions:
            region.feed(self._text)
            if not region.named:
                name = region.name(self._text)
                if name is None:
                    self._stuck = region.end is not None
                    break
                region.named = True
                fragments.append(ToolCallFragment(region.index, name))
            length = region.arguments_length(self._text)
            if length > region.sent:
                start = region.arguments_start
                piece = self._text.slice(start + region.sent, start + length)
                fragments.append(ToolCallFragment(region.index, None, piece))
                region.sent = length
        return fragments
