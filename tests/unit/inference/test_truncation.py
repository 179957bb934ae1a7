"""Context truncation: each rule on its own, their order, and properties for any conversation.

The rules run against the bundled model's real tokenizer and chat template (`hf_tokenizer`),
so every count and every "fits" is the engine's. Pure helpers are tested without one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.inference.truncation import (
    Entry,
    TruncatedChat,
    collapse_whitespace,
    dedupe_system,
    drop_repeats,
    kept_pieces,
    sentence_pieces,
    truncate_chat,
    turns,
)

Messages = list[dict[str, str]]


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


async def size(tokenizer: HFPromptTokenizer, messages: Messages) -> int:
    return len(await tokenizer.encode_chat(messages))


async def fit(tokenizer: HFPromptTokenizer, messages: Messages, limit: int) -> TruncatedChat:
    encoding = await tokenizer.encode_chat_counted(messages)
    result = await truncate_chat(tokenizer, messages, encoding, limit)
    assert result.ids == await tokenizer.encode_chat(result.messages), "ids are exact"
    return result


def sentences(topic: str, n: int) -> str:
    return " ".join(f"Sentence {i} is about {topic} and nothing else." for i in range(n))


SYSTEM = msg("system", "You are a careful assistant. " + sentences("rules", 8))

# ---- pure helpers -------------------------------------------------------------------------


def test_sentence_pieces_split_after_sentences_and_before_lines_and_join_back() -> None:
    text = 'One. Two? "Three!" Four\nfive 3.14 six.\n\n  seven  '
    pieces = sentence_pieces(text)
    assert "".join(pieces) == text
    assert pieces == ["One.", " Two?", ' "Three!"', " Four", "\nfive 3.14 six.", "\n\n  seven  "]
    assert sentence_pieces("no boundary at all") == ["no boundary at all"]
    assert sentence_pieces("Ends here.   ") == ["Ends here.   "]


def test_collapse_whitespace_keeps_words_lines_and_one_blank_line() -> None:
    text = "  a  \t b \n\n\n\n c   \n    d  "
    assert collapse_whitespace(text) == "a b\n\n c\n d", "indentation shrinks to one space"
    assert collapse_whitespace("already tidy\n\nyes") == "already tidy\n\nyes"


def test_kept_pieces_are_the_most_from_the_end_that_fit() -> None:
    counts_from_end = [5, 5, 5, 5]
    assert kept_pieces(counts_from_end, 19) == 3
    assert kept_pieces(counts_from_end, 14) == 2
    assert kept_pieces(counts_from_end, 5) == 1
    assert kept_pieces(counts_from_end, 0) == 1, "the last piece always stays"
    assert kept_pieces(counts_from_end, 0, first=False) == 0
    assert kept_pieces([3, 9, 1], 11) == 1, "pieces stay only while every later one does"


async def test_a_long_turn_is_counted_only_as_far_as_what_stays(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    counted: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(hf_tokenizer, name)

        async def count(self, texts: Sequence[str]) -> list[int]:
            counted.append(len(texts))
            return await hf_tokenizer.count(texts)

    old = " ".join(f"Sentence number {i} is here." for i in range(50_000))
    messages = [msg("user", old), msg("assistant", "Yes."), msg("user", "And?")]
    encoding = await hf_tokenizer.encode_chat_counted(messages)
    result = await truncate_chat(Counting(), messages, encoding, 200)  # type: ignore[arg-type]
    assert result.steps[-1] == "cut_turn" and len(result.ids) <= 200
    assert result.messages[0]["content"].endswith("Sentence number 49999 is here.")
    # The 50,000 sentences are split, but only those near the end are tokenized.
    assert sum(counted) < 1_000, counted


def entries(*specs: tuple[str, str]) -> list[Entry]:
    return [Entry(i, role, text, 1, len(text.split())) for i, (role, text) in enumerate(specs)]


def test_dedupe_system_drops_only_exact_repeats_of_system_text() -> None:
    conversation = entries(
        ("system", "Be kind."),
        ("user", "Be kind."),
        ("system", "Be kind."),
        ("system", "Be kind. "),
        ("user", "q"),
    )
    assert [e.index for e in dedupe_system(conversation)] == [0, 1, 3, 4]


def test_turns_group_older_messages_and_a_leading_group_before_the_first_user() -> None:
    conversation = entries(
        ("assistant", "Welcome"),
        ("system", "s"),
        ("user", "a"),
        ("assistant", "b"),
        ("system", "mid"),
        ("user", "c"),
        ("user", "last"),
        ("assistant", "prefill"),
    )

    def older(e: Entry) -> bool:
        return e.index < 6 and e.index != 1

    assert [[e.index for e in t] for t in turns(conversation, older)] == [[0], [2, 3, 4], [5]]


def test_drop_repeats_never_leaves_a_reply_without_its_user_message() -> None:
    conversation = entries(
        ("user", "continue"),
        ("assistant", "part one"),
        ("user", "continue"),  # repeated, but its reply is new: both stay
        ("assistant", "part two"),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "hi"),  # the whole turn repeats: it goes
        ("assistant", "hello"),
        ("assistant", "part  two"),  # a repeat once whitespace is collapsed
        ("user", "hi"),  # the last user message: never removed
    )
    collapsed = {e.index: collapse_whitespace(e.content) for e in conversation}

    def older(e: Entry) -> bool:
        return e.index < 9

    kept = drop_repeats(conversation, older, collapsed)
    assert [e.index for e in kept] == [0, 1, 2, 3, 4, 5, 9]


# ---- each rule on its own, with the real tokenizer ------------------------------------------


async def test_rule_1_alone_removes_a_repeated_system_message(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = [
        SYSTEM,
        msg("user", "Hello   there.\n\n\n\nHow   are   you?"),
        msg("assistant", "Fine."),
        SYSTEM,
        msg("user", "Tell me more."),
    ]
    without = [m for i, m in enumerate(messages) if i != 3]
    result = await fit(hf_tokenizer, messages, await size(hf_tokenizer, without))
    assert result.steps == ("dedupe_system",)
    assert result.kept == (0, 1, 2, 4)
    assert result.messages == without, "later rules did not run: the whitespace is intact"


async def test_rule_2_alone_collapses_whitespace_in_older_turns(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    spaced = "First   point .  \t Second\t\tpoint.\n\n\n\n\n   Third    point.   " * 6
    last = msg("user", "And   now?")
    messages = [SYSTEM, msg("user", spaced), msg("assistant", "Noted.   Fine."), last]
    tidy = [
        SYSTEM,
        msg("user", collapse_whitespace(spaced)),
        msg("assistant", "Noted. Fine."),
        last,
    ]
    limit = await size(hf_tokenizer, tidy)
    assert await size(hf_tokenizer, messages) > limit
    result = await fit(hf_tokenizer, messages, limit)
    assert result.steps == ("compress",)
    assert result.messages == tidy, (
        "only older turns change; the last user message keeps its spaces"
    )


async def test_rule_2_alone_drops_exact_repeats_of_earlier_turns(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    question, answer = msg("user", sentences("weather", 3)), msg("assistant", sentences("sun", 3))
    messages = [SYSTEM, question, answer, question, answer, question, answer, msg("user", "Ok?")]
    result = await fit(
        hf_tokenizer, messages, await size(hf_tokenizer, messages[:3] + messages[-1:])
    )
    assert result.steps == ("compress",)
    assert result.kept == (0, 1, 2, 7)


async def test_rule_3_alone_drops_the_oldest_turns_whole(hf_tokenizer: HFPromptTokenizer) -> None:
    messages = [SYSTEM]
    for i in range(6):
        messages += [msg("user", f"Question {i} about one thing"), msg("assistant", f"Answer {i}")]
    messages.append(msg("user", "Last question"))
    keep = [SYSTEM, *messages[5:]]  # turns 0 and 1 must go
    result = await fit(hf_tokenizer, messages, await size(hf_tokenizer, keep))
    assert result.steps == ("drop_turns",)
    assert result.kept == (0, *range(5, 14))
    assert result.messages == keep


async def test_rule_4_alone_cuts_the_oldest_turn_at_sentences_keeping_its_end(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    long = sentences("history", 30)
    messages = [SYSTEM, msg("user", long), msg("assistant", "Understood."), msg("user", "Go on.")]
    limit = await size(hf_tokenizer, messages) - 40
    result = await fit(hf_tokenizer, messages, limit)
    assert result.steps == ("cut_turn",)
    assert result.kept == (0, 1, 2, 3)
    cut = result.messages[1]["content"]
    assert long.endswith(cut) and cut.startswith("Sentence ") and len(cut) < len(long)
    assert result.messages[2:] == messages[2:]
    # It kept as much as fits: one more sentence would not.
    one_more = long[long.rindex("Sentence ", 0, len(long) - len(cut)) :]
    wider = [SYSTEM, msg("user", one_more), *messages[2:]]
    assert await size(hf_tokenizer, wider) > limit
    assert len(result.ids) <= limit


async def test_the_rules_apply_in_their_order(hf_tokenizer: HFPromptTokenizer) -> None:
    repeated = [msg("user", "Hi there."), msg("assistant", "Hello.")]
    long = "  ".join(f"Point {i} explains the   plan in detail." for i in range(30))
    messages = [
        SYSTEM,
        SYSTEM,
        *repeated,
        *repeated,
        msg("user", long),
        msg("assistant", "Right."),
        msg("user", "Summarise."),
    ]
    base = [SYSTEM, msg("user", collapse_whitespace(long)), *messages[-2:]]
    limit = await size(hf_tokenizer, base) - 30
    result = await fit(hf_tokenizer, messages, limit)
    assert result.steps == ("dedupe_system", "compress", "drop_turns", "cut_turn")
    assert result.kept == (0, 6, 7, 8)
    assert collapse_whitespace(long).endswith(result.messages[1]["content"])
    assert len(result.ids) <= limit


async def test_the_last_user_message_is_never_cut(hf_tokenizer: HFPromptTokenizer) -> None:
    messages = [SYSTEM, msg("user", sentences("a long question", 40))]
    result = await fit(hf_tokenizer, messages, 100)
    assert result.messages == messages
    assert len(result.ids) > 100, "the caller answers 400: the last user message alone is too long"


# ---- properties, for any conversation ---------------------------------------------------------

WORDS = ["alpha", "beta", "gamma", "user", "assistant", "system", "3.14", "ok", "é", "字"]
sentence_text = st.builds(
    lambda words, end, gap: " ".join(words) + end + gap,
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
    st.sampled_from([".", "!", "?", "", "\n"]),
    st.sampled_from([" ", "  ", "\n\n\n", "\t", ""]),
)
contents = st.one_of(
    st.lists(sentence_text, min_size=0, max_size=12).map("".join),
    st.sampled_from(["", "Same text.", "Same  text.", "user", "\n"]),
)
conversations = st.lists(
    st.tuples(st.sampled_from(["system", "user", "user", "assistant", "assistant"]), contents),
    min_size=1,
    max_size=14,
).map(lambda pairs: [msg(role, text) for role, text in pairs])


def core_indices(messages: Sequence[dict[str, str]]) -> list[int]:
    """What the rules never remove: the first system message, the last user message (or the
    last message) and what follows it, minus system messages repeating an earlier one."""
    roles = [m["role"] for m in messages]
    first_system = roles.index("system") if "system" in roles else None
    last_user = max((i for i, r in enumerate(roles) if r == "user"), default=len(messages) - 1)
    core, seen = [], set()
    for i, m in enumerate(messages):
        if m["role"] == "system":
            if m["content"] in seen:
                continue
            seen.add(m["content"])
        if i == first_system or i >= last_user:
            core.append(i)
    return core


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=conversations, share=st.floats(min_value=0.05, max_value=1.05))
def test_any_conversation_fits_and_keeps_what_it_must(
    hf_tokenizer: HFPromptTokenizer, conversation: Messages, share: float
) -> None:
    full = asyncio.run(size(hf_tokenizer, conversation))
    limit = max(1, int(full * share))
    result = asyncio.run(fit(hf_tokenizer, conversation, limit))
    core = core_indices(conversation)
    event(",".join(result.steps) or "fits as it is")
    if len(result.ids) > limit:
        event("the core alone is too long")
        assert list(result.kept) == core, "only an oversized core is ever left over the limit"
        return
    kept = list(result.kept)
    assert kept == sorted(set(kept)), "an in-order subsequence"
    assert set(core) <= set(kept), "the first system and last user messages stay"
    originals = [conversation[i] for i in kept]
    for i in core:
        assert result.messages[kept.index(i)] == conversation[i], "untouched"
    changed_turns = set()
    roles = [m["role"] for m in conversation]
    for i, original, now in zip(kept, originals, result.messages, strict=True):
        assert now["role"] == original["role"]
        before, after = collapse_whitespace(original["content"]), now["content"]
        assert before.endswith(after) or after == original["content"]
        if after not in (before, original["content"]):  # the sentence cut
            changed_turns.add(max((j for j in range(i + 1) if roles[j] == "user"), default=-1))
        if original["role"] == "assistant" and i not in core:
            answered = max((j for j in range(i) if roles[j] == "user"), default=None)
            assert answered is None or answered in kept, "no reply without its user message"
    assert len(changed_turns) <= 1, "only one turn is cut"
