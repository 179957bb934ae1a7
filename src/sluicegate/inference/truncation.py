"""Context truncation: the rules that make a conversation fit, applied in this order.

    1. dedupe_system  system messages that repeat an earlier system message's text go
    2. compress       in older turns, runs of whitespace collapse and exact repeats of earlier
                      messages go
    3. drop_turns     the oldest user/assistant turns go, whole
    4. cut_turn       the oldest remaining turn is cut at sentence boundaries, its end kept

The rules stop as soon as the conversation fits. Never removed: the first system message, the
last user message (the last message, if there is no user message) and whatever follows it. A
turn is a user message with the messages after it up to the next user message, so an
assistant reply never stays without the user message it answered. Step 3 drops turns while
dropping the oldest one is not enough; the turn whose removal would be enough is cut instead
(step 4) if keeping at least the last sentence of each of its messages frees enough, and
dropped otherwise.

Counting: the rules work on a `ChatEncoding`, which attributes every token of the exact prompt
to a message, and tokenize only the text they change (in one batch, off the event loop when
long). The chosen conversation is then encoded once, exactly; if the estimate fell short, the
shortfall becomes a margin and the rules run again.

A tokenizer that counts only whole prompts, one costly call each (an upstream's `/tokenize`),
marks its encoding with a density (`ChatEncoding.tokens_per_char`): the rules then estimate
the text they change from its characters at that density instead of counting it, and the
chosen conversation is checked whole at most `ESTIMATED_ROUNDS` times before only the
protected messages are kept. A request costs that tokenizer a handful of calls, however many
sentences it has; counted piece by piece, a 120 kB turn took 5,000 to 40,000.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, pairwise
from typing import Any, Literal

from sluicegate.engine.protocol import (
    MAX_TOKEN_CHARS,
    ChatEncoding,
    ChatMessages,
    PromptTokenizer,
    TemplateKwargs,
    Tools,
)
from sluicegate.offload import offload

Step = Literal["dedupe_system", "compress", "drop_turns", "cut_turn"]

# A sentence ends at . ! ? or … (and any closing quotes or brackets) before whitespace; a line
# ends before a newline. The whitespace goes with the sentence that follows.
_BOUNDARY = re.compile(r"(?<=[.!?…])[\"'”’)\]]*(?=\s)|(?<=\S)(?=\n)")
# Runs of two or more spaces or tabs, or one whitespace character other than space and newline.
_SPACES = re.compile(r"[^\S\n]{2,}|[^\S\n ]")
_BLANK_LINES = re.compile(r"\n{3,}")
# What `_SPACES` can find in ASCII text: substring tests are much quicker than the regex.
_ASCII_RUNS = ("  ", "\t", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f")
_NOT_SPACE = re.compile(r"\S")
# Regex work on long texts goes in pieces of about this many characters, so that no single
# C call holds the GIL (and so the event loop, from a worker thread) for long.
_PIECE = 64 * 1024
# Sentences counted at first when cutting a turn from its end; each further batch is 4x larger.
_FIRST_BATCH = 64
ESTIMATED_ROUNDS = 3
"""Whole-prompt checks of a conversation fitted on estimated counts, before the last resort
(only the protected messages): the estimate is the prompt's own density, so the first check
nearly always passes and the second takes the shortfall as a margin."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the conversation, with the prompt tokens it accounts for."""

    index: int
    """Position in the request."""
    role: str
    content: str
    framing: int
    """Tokens the template adds for the message (role header, end markers)."""
    content_tokens: int
    """Tokens of the content; for text a rule changed and nobody counted yet, the count
    before the change (an upper bound: the rules only take text away)."""
    counted: bool = True
    fields: Mapping[str, Any] = field(default_factory=dict)
    """The message's other fields (tool calls, tool call id), kept as they are."""

    @property
    def tokens(self) -> int:
        return self.framing + self.content_tokens

    def with_content(self, content: str, content_tokens: int | None = None) -> Entry:
        """With `content`, counted as `content_tokens`, or not yet counted when None."""
        if content_tokens is not None:
            return replace(self, content=content, content_tokens=content_tokens, counted=True)
        if content == self.content:
            return self
        return replace(self, content=content, counted=False)

    def message(self) -> dict[str, Any]:
        return {**self.fields, "role": self.role, "content": self.content}

    @property
    def identity(self) -> str:
        """What, beside its text, makes two messages the same: their tool fields."""
        return json.dumps(self.fields, sort_keys=True) if self.fields else ""


@dataclass(frozen=True, slots=True)
class TruncatedChat:
    ids: list[int]
    """The exact prompt. Longer than the limit only when the protected messages alone are."""
    messages: list[dict[str, Any]]
    kept: tuple[int, ...]
    """Request positions of the messages kept, in order."""
    steps: tuple[Step, ...]


async def truncate_chat(
    tokenizer: PromptTokenizer,
    messages: ChatMessages,
    encoding: ChatEncoding,
    limit: int,
    tools: Tools | None = None,
    template_kwargs: TemplateKwargs | None = None,
) -> TruncatedChat:
    """Fit `messages`, whose exact encoding (with `tools` and `template_kwargs`) is
    `encoding`, into `limit` prompt tokens. The tools are rendered whatever goes: they are
    never truncated."""
    entries = entries_of(messages, encoding)
    fixed = encoding.length - sum(e.tokens for e in entries)
    density = encoding.tokens_per_char
    planner = _Planner(entries, fixed, tokenizer, density)
    bound = limit
    rounds = 0
    while True:
        plan = await planner.plan(bound)
        ids = await tokenizer.encode_chat([e.message() for e in plan.kept], tools, template_kwargs)
        rounds += 1
        if len(ids) <= limit or plan.exhausted:
            kept = tuple(e.index for e in plan.kept)
            return TruncatedChat(ids, [e.message() for e in plan.kept], kept, plan.steps)
        # The estimate was short by len(ids) - plan.estimate: aim that much lower, and always
        # below the last estimate, so every round removes more and the loop ends.
        bound = min(limit - (len(ids) - plan.estimate), plan.estimate - 1)
        if density is not None and rounds >= ESTIMATED_ROUNDS:
            bound = -1  # each check is a costly call: keep only what must stay


def entries_of(messages: ChatMessages, encoding: ChatEncoding) -> list[Entry]:
    """The messages with their token counts.

    The first message's framing may hold the template's preamble (a BOS token, a default
    system prompt) that stays whatever goes; beyond the least framing of the other messages,
    it is not counted as the first message's."""
    contents = encoding.content_tokens
    framings = [t - c for t, c in zip(encoding.message_tokens, contents, strict=True)]
    others = [f for f, m in zip(framings[1:], messages[1:], strict=True) if m["content"]]
    if others and messages[0]["content"]:
        framings[0] = min(framings[0], min(others))
    return [
        Entry(i, m["role"], m["content"], max(0, framings[i]), contents[i], True, _fields(m))
        for i, m in enumerate(messages)
    ]


def _fields(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in ("role", "content")}


@dataclass(frozen=True, slots=True)
class _Plan:
    kept: list[Entry]
    steps: tuple[Step, ...]
    estimate: int
    exhausted: bool
    """Nothing more may go: only the protected messages are left."""


class _Planner:
    """Applies the rules for a bound on the estimated prompt tokens.

    Steps 3 and 4 walk the turns from the newest, keeping each one that fits in what is
    left: that keeps the same turns as dropping the oldest until the rest fits, and only the
    text of turns that may stay is ever tokenized."""

    def __init__(
        self,
        entries: list[Entry],
        fixed: int,
        tokenizer: PromptTokenizer,
        density: float | None = None,
    ):
        self._entries = entries
        self._fixed = fixed
        self._tokenizer = tokenizer
        self._density = density
        """Tokens per character when texts are estimated, not counted (see the module)."""
        self._counts: dict[str, int] = {}
        self._collapsed: dict[int, str] | None = None
        first_system = next((e.index for e in entries if e.role == "system"), None)
        # Without a user message, the last message stands in for it: something must stay.
        last_user = max((e.index for e in entries if e.role == "user"), default=len(entries) - 1)
        self._older: Callable[[Entry], bool] = lambda e: (
            e.index < last_user and e.index != first_system
        )

    async def plan(self, bound: int) -> _Plan:
        """The rules, applied until the estimated prompt is within `bound`."""
        steps: list[Step] = []
        kept = dedupe_system(self._entries)
        if len(kept) < len(self._entries):
            steps.append("dedupe_system")
        if self._fixed + sum(e.tokens for e in kept) <= bound:
            return self._plan(kept, steps, bound)
        if self._collapsed is None:
            size = sum(len(e.content) for e in self._entries)
            self._collapsed = await offload.run(size, collapse_all, self._entries)
        compressed = compress(kept, self._older, self._collapsed)
        if compressed != kept:
            steps.append("compress")
        older = turns(compressed, self._older)
        staying: dict[int, Entry] = {e.index: e for e in compressed if not self._older(e)}
        room = bound - self._fixed - sum(e.tokens for e in staying.values())
        for position in range(len(older) - 1, -1, -1):
            turn = await self._counted(older, position, room)
            cost = sum(e.tokens for e in turn)
            if cost <= room:
                room -= cost
                staying.update((e.index, e) for e in turn)
                continue
            cut = await self._cut(turn, cost - room) if room > 0 else None
            if position > 0 or cut is None:
                steps.append("drop_turns")
            if cut is not None:
                steps.append("cut_turn")
                staying.update((e.index, e) for e in cut)
            break
        return self._plan([staying[i] for i in sorted(staying)], steps, bound)

    def _plan(self, kept: list[Entry], steps: list[Step], bound: int) -> _Plan:
        estimate = self._fixed + sum(e.tokens for e in kept)
        return _Plan(kept, tuple(steps), estimate, estimate > bound)

    async def _count(self, texts: list[str]) -> list[int]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._counts))
        if missing:
            self._counts.update(zip(missing, await self._measure(missing), strict=True))
        return [self._counts[t] for t in texts]

    async def _measure(self, texts: Sequence[str]) -> list[int]:
        """The texts' token counts: from the tokenizer, or estimated from their characters
        when it counts only whole prompts."""
        if self._density is None:
            return await self._tokenizer.count(texts)
        return [round(len(t) * self._density) for t in texts]

    async def _counted(self, older: list[list[Entry]], position: int, room: int) -> list[Entry]:
        """Turn `position` with exact counts. Uncounted text is counted in one batch for it
        and the older turns that may still fit in `room` (by their upper bounds). A text too
        long to fit whatever it counts (by characters) keeps its upper bound: it will be cut,
        and tokenizing megabytes only to learn that would cost seconds."""
        if all(e.counted for e in older[position]):
            return older[position]
        longest = MAX_TOKEN_CHARS * max(room, 0)
        texts: list[str] = []
        for turn in reversed(older[: position + 1]):
            texts.extend(e.content for e in turn if not e.counted and len(e.content) <= longest)
            room -= sum(e.tokens for e in turn)
            if room < 0:
                break
        await self._count(texts)
        for earlier in range(position + 1):
            older[earlier] = [self._with_count(e) for e in older[earlier]]
        return older[position]

    def _with_count(self, entry: Entry) -> Entry:
        count = self._counts.get(entry.content)
        if entry.counted or count is None:
            return entry
        return entry.with_content(entry.content, count)

    async def _cut(self, turn: list[Entry], need: int) -> list[Entry] | None:
        """The turn cut from its start, each message keeping at least its last sentence, to
        free `need` tokens; None when that is not enough."""
        if need >= sum(e.content_tokens for e in turn):
            return None  # even empty contents would not do
        cut: list[Entry] = []
        for entry in turn:
            text = entry.content
            pieces = await offload.run(len(text), sentence_pieces, text) if need > 0 else []
            if len(pieces) < 2:
                cut.append(entry)
                continue
            kept, kept_tokens = await self._kept_suffix(pieces, entry.content_tokens - need)
            text = "".join(pieces[len(pieces) - kept :]).lstrip()
            cut.append(entry.with_content(text, kept_tokens))
            need -= entry.content_tokens - kept_tokens
        return cut if need <= 0 else None

    async def _kept_suffix(self, pieces: list[str], allowance: int) -> tuple[int, int]:
        """How many of the last pieces fit in `allowance` tokens, and their tokens: at least
        the last piece, never the first.

        Pieces are counted from the end in growing batches (not memoized: they are many and
        rarely seen again), so a long text is counted only as far as what can stay."""
        kept = kept_tokens = 0
        end, batch = len(pieces), _FIRST_BATCH
        while end > 1:
            start = max(1, end - batch)
            counts = await self._measure(pieces[start:end])
            more = kept_pieces(counts[::-1], allowance - kept_tokens, first=not kept)
            kept, kept_tokens = kept + more, kept_tokens + sum(counts[len(counts) - more :])
            if more < len(counts):
                break
            end, batch = start, batch * 4
        return kept, kept_tokens


# ---- the rules, as pure functions ---------------------------------------------------------


def dedupe_system(entries: list[Entry]) -> list[Entry]:
    """Without system messages whose text an earlier system message already has."""
    seen: set[str] = set()
    kept = []
    for entry in entries:
        if entry.role == "system":
            if entry.content in seen:
                continue
            seen.add(entry.content)
        kept.append(entry)
    return kept


def collapse_all(entries: Sequence[Entry]) -> dict[int, str]:
    """Every message's text with whitespace collapsed, by request position."""
    return {e.index: collapse_whitespace(e.content) for e in entries}


def collapse_whitespace(text: str) -> str:
    """Runs of spaces and tabs become one space, lines lose trailing spaces, runs of blank
    lines become one, and the ends are stripped."""
    return "".join(_collapse_piece(piece) for piece in _pieces(text)).strip()


def _collapse_piece(text: str) -> str:
    if not text.isascii() or any(run in text for run in _ASCII_RUNS):
        text = _SPACES.sub(" ", text)
    text = text.replace(" \n", "\n")
    if "\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text


def _pieces(text: str) -> Iterator[str]:
    """`text` in pieces of about `_PIECE` characters, each cut just before a non-whitespace
    character, so that no run of whitespace is split between two pieces."""
    start = 0
    while len(text) - start > _PIECE:
        found = _NOT_SPACE.search(text, start + _PIECE)
        if found is None:
            break
        yield text[start : found.start()]
        start = found.start()
    yield text[start:]


def compress(
    entries: list[Entry], older: Callable[[Entry], bool], collapsed: Mapping[int, str]
) -> list[Entry]:
    """Older messages with whitespace collapsed (`collapsed` maps request positions to the
    collapsed text), and without those that repeat an earlier message."""
    entries = [e.with_content(collapsed[e.index]) if older(e) else e for e in entries]
    return drop_repeats(entries, older, collapsed)


def drop_repeats(
    entries: list[Entry], older: Callable[[Entry], bool], collapsed: Mapping[int, str]
) -> list[Entry]:
    """Without older messages that repeat an earlier message (same role, same text once
    whitespace is collapsed). A repeated user message goes only if its whole turn does."""
    seen: set[tuple[str, str, str]] = set()
    repeats: set[int] = set()
    for entry in entries:
        key = (entry.role, collapsed[entry.index], entry.identity)
        if older(entry) and key in seen:
            repeats.add(entry.index)
        seen.add(key)
    for turn in turns(entries, older):
        head = turn[0]
        if head.role == "user" and any(e.index not in repeats for e in turn):
            repeats.discard(head.index)
    return [e for e in entries if e.index not in repeats]


def turns(entries: list[Entry], older: Callable[[Entry], bool]) -> list[list[Entry]]:
    """The older messages grouped into turns, oldest first: each user message starts one;
    messages before the first user message form one of their own."""
    grouped: list[list[Entry]] = []
    for entry in entries:
        if not older(entry):
            continue
        if entry.role == "user" or not grouped:
            grouped.append([entry])
        else:
            grouped[-1].append(entry)
    return grouped


def sentence_pieces(text: str) -> list[str]:
    """`text` split before each sentence or line that follows another; they join back to it.
    Linear in the length of `text`: no piece starts in its trailing whitespace."""
    end = len(text.rstrip())
    cuts = [0]
    for match in _BOUNDARY.finditer(text):
        at = match.end()
        if cuts[-1] < at < end:
            cuts.append(at)
    cuts.append(len(text))
    return [text[a:b] for a, b in pairwise(cuts)]


def kept_pieces(counts_from_end: Sequence[int], allowance: int, first: bool = True) -> int:
    """How many pieces, taken from the end (`counts_from_end` lists their token counts last
    piece first), fit together in `allowance` tokens. With `first`, the last piece counts as
    fitting even when it alone does not: something must stay."""
    totals = list(accumulate(counts_from_end))
    fitting = bisect_right(totals, allowance)
    return max(fitting, 1) if first and totals else fitting
