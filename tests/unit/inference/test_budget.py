"""The token budget with the bundled model's real tokenizer: exact counts, the max_tokens a
request gets, when truncation starts, and what the report says."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.engine.tokenizer import INLINE_LIMIT_CHARS, HFPromptTokenizer
from sluicegate.errors import ContextLengthExceededError
from sluicegate.inference.budget import BudgetPolicy, BudgetReport, TokenBudget
from sluicegate.observability.metrics import (
    BUDGET_CLAMPED_MAX_TOKENS,
    BUDGET_DROPPED_TOKENS,
    BUDGET_TRIMMED_REQUESTS,
)
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app

SYSTEM = {"role": "system", "content": "You are terse."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
# The longest the event loop may wait while a long conversation is fitted: a stall a user
# would see, about 50 times the few milliseconds measured (two cores, another test process).
STALL_BOUND_S = 0.5


def chat(turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me fact number {i} about Paris."})
        messages.append({"role": "assistant", "content": f"Fact {i}: Paris is in France."})
    return [*messages, QUESTION]


def budget(tokenizer: HFPromptTokenizer, max_model_len: int, **policy: object) -> TokenBudget:
    return TokenBudget(tokenizer, max_model_len, BudgetPolicy(**policy))  # type: ignore[arg-type]


def exact_ids(tokenizer: HFPromptTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """What vLLM's own server would send: the template rendered, then tokenized."""
    hf = tokenizer._tokenizer
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(hf.encode(text, add_special_tokens=False))


def counter(metric: object) -> float:
    return float(metric._value.get())  # type: ignore[attr-defined]


async def test_counts_are_the_ids_the_engine_gets(hf_tokenizer: HFPromptTokenizer) -> None:
    messages = chat(3)
    fitted = await budget(hf_tokenizer, 4096).fit_chat(messages, max_tokens=None)
    assert fitted.prompts == [exact_ids(hf_tokenizer, messages)]
    report = fitted.report
    assert report.prompt_tokens_before == report.prompt_tokens_after == len(fitted.prompts[0])
    assert (report.messages_dropped, report.steps) == (0, ())


async def test_counted_encoding_attributes_every_token_to_a_message(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = chat(4)
    encoding = await hf_tokenizer.encode_chat_counted(messages)
    assert encoding.ids == exact_ids(hf_tokenizer, messages)
    assert await hf_tokenizer.count([m["content"] for m in messages]) == list(
        encoding.content_tokens
    )
    # Removing messages removes exactly the tokens attributed to them.
    without = [m for i, m in enumerate(messages) if i not in (1, 2)]
    predicted = len(encoding.ids) - encoding.message_tokens[1] - encoding.message_tokens[2]
    assert predicted == len(exact_ids(hf_tokenizer, without))


async def test_without_max_tokens_the_completion_gets_a_share_of_the_budget(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = [SYSTEM, QUESTION]
    prompt = len(exact_ids(hf_tokenizer, messages))
    fitted = await budget(hf_tokenizer, 1024).fit_chat(messages, max_tokens=None)
    assert fitted.max_tokens == int((1024 - prompt) * 0.7)
    assert fitted.report.max_tokens_source == "default"
    capped = await budget(hf_tokenizer, 1024, default_max_tokens=100).fit_chat(
        messages, max_tokens=None
    )
    assert capped.max_tokens == 100
    bare = await budget(hf_tokenizer, 1024, reserve_ratio=0.0).fit_chat(messages, max_tokens=None)
    assert bare.max_tokens == 1024 - prompt


async def test_max_tokens_over_the_budget_is_clamped_or_refused(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = [SYSTEM, QUESTION]
    prompt = len(exact_ids(hf_tokenizer, messages))
    clamped_before = counter(BUDGET_CLAMPED_MAX_TOKENS)
    within = await budget(hf_tokenizer, 512).fit_chat(messages, max_tokens=512 - prompt)
    assert (within.max_tokens, within.report.max_tokens_source) == (512 - prompt, "client")
    over = await budget(hf_tokenizer, 512).fit_chat(messages, max_tokens=10**9)
    assert (over.max_tokens, over.report.max_tokens_source) == (512 - prompt, "clamped")
    assert counter(BUDGET_CLAMPED_MAX_TOKENS) == clamped_before + 1
    with pytest.raises(ContextLengthExceededError) as caught:
        await budget(hf_tokenizer, 512, overflow="error").fit_chat(messages, max_tokens=600)
    assert f"you requested {prompt + 600} tokens ({prompt} in the messages, 600 in the" in str(
        caught.value
    )
    assert caught.value.param == "messages"


async def test_truncation_starts_when_less_than_the_minimum_completion_remains(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = chat(6)
    prompt = len(exact_ids(hf_tokenizer, messages))
    # 16 tokens left: nothing to do.
    untouched = await budget(hf_tokenizer, prompt + 16).fit_chat(messages, max_tokens=None)
    assert untouched.report.steps == () and untouched.max_tokens == 16
    # 15 left: the oldest turn goes, and the completion gets at least 16.
    trimmed_before = counter(BUDGET_TRIMMED_REQUESTS)
    dropped_before = counter(BUDGET_DROPPED_TOKENS)
    fitted = await budget(hf_tokenizer, prompt + 15).fit_chat(messages, max_tokens=None)
    report = fitted.report
    assert report.steps == ("drop_turns",) and report.messages_dropped == 2
    assert report.prompt_tokens_before == prompt
    assert report.prompt_tokens_after == len(fitted.prompts[0]) <= prompt + 15 - 16
    assert fitted.max_tokens >= 16
    assert counter(BUDGET_TRIMMED_REQUESTS) == trimmed_before + 1
    assert counter(BUDGET_DROPPED_TOKENS) == dropped_before + prompt - report.prompt_tokens_after
    # A client asking for fewer tokens than the minimum needs only that much room.
    small = await budget(hf_tokenizer, prompt + 4).fit_chat(messages, max_tokens=4)
    assert small.report.steps == () and small.max_tokens == 4
    # min_tokens is room the completion must have, too.
    room = await budget(hf_tokenizer, prompt + 20).fit_chat(
        messages, max_tokens=None, min_tokens=30
    )
    assert room.report.steps and room.max_tokens >= 30


async def test_truncation_disabled_refuses_instead(hf_tokenizer: HFPromptTokenizer) -> None:
    messages = chat(6)
    prompt = len(exact_ids(hf_tokenizer, messages))
    with pytest.raises(ContextLengthExceededError) as caught:
        await budget(hf_tokenizer, prompt + 10).fit_chat(
            messages, max_tokens=None, truncation="disabled"
        )
    assert f"you requested {prompt + 16} tokens ({prompt} in the messages, 16 in" in str(
        caught.value
    )
    off = budget(hf_tokenizer, prompt + 10, chat_truncation="disabled")
    with pytest.raises(ContextLengthExceededError):
        await off.fit_chat(messages, max_tokens=None)
    fitted = await off.fit_chat(messages, max_tokens=None, truncation="auto")
    assert fitted.report.steps == ("drop_turns",), "the request's field wins over the default"


async def test_a_last_user_message_alone_too_long_is_a_400_with_the_numbers(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = [*chat(2)[:-1], {"role": "user", "content": "word " * 600}]
    alone = len(exact_ids(hf_tokenizer, [SYSTEM, messages[-1]]))
    before = len(exact_ids(hf_tokenizer, messages))
    with pytest.raises(ContextLengthExceededError) as caught:
        await budget(hf_tokenizer, 512).fit_chat(messages, max_tokens=None)
    error = caught.value
    assert error.code == "context_length_exceeded" and error.status_code == 400
    assert "maximum context length is 512 tokens and the completion needs at least 16" in (
        error.message
    )
    assert f"the messages take {before} tokens, and still {alone} with every older" in (
        error.message
    )
    assert "does not fit in 496 tokens" in error.message


async def test_text_prompts_are_cut_at_the_start_when_configured(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    prompt = await hf_tokenizer.encode("one two three " * 200)
    short = await hf_tokenizer.encode("Hello there")
    with pytest.raises(ContextLengthExceededError) as caught:
        await budget(hf_tokenizer, 256).fit_prompts([prompt], max_tokens=None)
    assert caught.value.param == "prompt"
    fitted = await budget(hf_tokenizer, 256).fit_prompts(
        [prompt, short], max_tokens=None, truncation="auto"
    )
    kept, untouched = fitted.prompts
    assert kept == prompt[-(256 - 16) :] and untouched == short
    assert fitted.report == BudgetReport(
        len(prompt) + len(short), 240 + len(short), 16, "default", 0, ("cut_prompt",)
    )
    with_bos = await budget(hf_tokenizer, 256, completion_truncation="auto").fit_prompts(
        [[7, *prompt]], max_tokens=8, keep_prefix=1
    )
    assert with_bos.prompts == [[7, *prompt[-(256 - 8 - 1) :]]], "the leading special token stays"
    assert with_bos.max_tokens == 8


async def test_long_conversations_are_counted_and_trimmed_off_the_event_loop(
    hf_tokenizer: HFPromptTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    paragraph = "The gateway counts every token of this long paragraph again. " * 40
    messages = [SYSTEM]
    for i in range(60):
        messages += [
            {"role": "user", "content": f"{i}: {paragraph}"},
            {"role": "assistant", "content": f"{i}:  {paragraph}  "},
        ]
    messages.append(QUESTION)
    longest_gap = 0.0
    running = True

    async def probe() -> None:
        nonlocal longest_gap
        loop = asyncio.get_running_loop()
        while running:
            started = loop.time()
            await asyncio.sleep(0.001)
            longest_gap = max(longest_gap, loop.time() - started)

    # Each piece of tokenizer work: its size (what decides inline or not), and the thread
    # that ran it. Off the loop is what the thread says, not how long anything took.
    ran: list[tuple[int, str, str]] = []
    run = hf_tokenizer._run

    async def recorded(size: int, fn: Callable[..., Any], *args: Any) -> Any:
        def traced(*inner: Any) -> Any:
            ran.append((size, fn.__name__, threading.current_thread().name))
            return fn(*inner)

        return await run(size, traced, *args)

    await budget(hf_tokenizer, 2048).fit_chat(messages[-30:], max_tokens=None)  # warm-up
    monkeypatch.setattr(hf_tokenizer, "_run", recorded)
    loop_thread = threading.current_thread().name
    task = asyncio.create_task(probe())
    await asyncio.sleep(0.01)
    fitted = await budget(hf_tokenizer, 2048).fit_chat(messages, max_tokens=None)
    running = False
    await task
    assert fitted.report.prompt_tokens_before > 50_000
    assert len(fitted.prompts[0]) <= 2048 - 16
    # Every piece over the inline limit ran on the tokenizer's thread, and there were such
    # pieces (the whole conversation is far over it): the loop was never held by them.
    large = [(size, name, thread) for size, name, thread in ran if size > INLINE_LIMIT_CHARS]
    assert large, ran
    assert all(thread != loop_thread for _, _, thread in large), large
    # And a stall a user would see is caught whatever its cause (a few ms here, where the
    # fit takes tens of them).
    assert longest_gap < STALL_BOUND_S, (
        f"the event loop waited {longest_gap * 1000:.0f} ms at most while the conversation "
        f"was fitted; tokenizer work, size, function and thread: {ran}"
    )


def test_report_headers_say_what_happened() -> None:
    report = BudgetReport(900, 480, 16, "default", 12, ("compress", "drop_turns"))
    assert report.headers() == {
        "X-Budget-Prompt-Tokens-Before": "900",
        "X-Budget-Prompt-Tokens-After": "480",
        "X-Budget-Messages-Dropped": "12",
        "X-Budget-Truncation": "compress,drop_turns",
        "X-Budget-Max-Tokens": "16",
        "X-Budget-Max-Tokens-Source": "default",
    }
    assert BudgetReport(5, 5, 3, "client").headers()["X-Budget-Truncation"] == "none"


# ---- through the app, over the fake engine (whitespace tokens) -------------------------------


def long_chat(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} has five words"})
        messages.append({"role": "assistant", "content": f"answer {i} has five words"})
    return [*messages, {"role": "user", "content": "and now?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_budget_headers_on_streamed_and_whole_responses_over_the_fake_engine(
    stream: bool,
) -> None:
    engine = FakeEngine(max_model_len=64)
    body = {
        "model": FAKE_MODEL,
        "messages": long_chat(10),  # 3 + 10 * 12 + 3 = 126 whitespace tokens
        "max_tokens": 1000,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    with TestClient(fake_app(engine)) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    headers = response.headers
    _, prompt, options = engine.requests[-1]
    assert headers["x-budget-prompt-tokens-before"] == "126"
    assert headers["x-budget-prompt-tokens-after"] == str(len(prompt))
    assert len(prompt) <= 64 - 16
    assert headers["x-budget-messages-dropped"] == "14"  # 3 of 10 turns (12 tokens each) fit
    assert headers["x-budget-truncation"] == "drop_turns"
    assert headers["x-budget-max-tokens"] == str(options.max_tokens) == str(64 - len(prompt))
    assert headers["x-budget-max-tokens-source"] == "clamped"
    if stream:
        usage = json.loads(response.text.split("data: ")[-2])["usage"]
    else:
        usage = response.json()["usage"]
    assert usage["prompt_tokens"] == len(prompt), "usage counts what was sent"


def test_truncation_field_is_validated_over_the_fake_engine() -> None:
    body = {"model": FAKE_MODEL, "messages": long_chat(10), "truncation": "sometimes"}
    with TestClient(fake_app(FakeEngine())) as client:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "truncation"
        refused = client.post(
            "/v1/chat/completions", json={**body, "truncation": "disabled"}
        ).json()
        assert refused["error"]["code"] == "context_length_exceeded"


def test_completion_prompts_are_cut_when_configured_over_the_fake_engine() -> None:
    engine = FakeEngine(max_model_len=64)
    body = {"model": FAKE_MODEL, "prompt": " ".join(f"w{i}" for i in range(100))}
    with TestClient(fake_app(engine)) as client:
        refused = client.post("/v1/completions", json=body)
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        cut = client.post("/v1/completions", json={**body, "truncation": "auto"})
    assert cut.status_code == 200
    assert cut.headers["x-budget-truncation"] == "cut_prompt"
    assert cut.json()["usage"]["prompt_tokens"] == 48 == len(engine.requests[-1][1])
    with TestClient(fake_app(engine, completion_truncation="auto")) as client:
        assert client.post("/v1/completions", json=body).status_code == 200


async def test_with_overflow_error_truncation_makes_room_for_the_whole_max_tokens(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = chat(12)
    prompt = len(exact_ids(hf_tokenizer, messages))
    # The prompt leaves 40 tokens; the client insists on 100: older turns go to make room.
    strict = budget(hf_tokenizer, prompt + 40, overflow="error")
    fitted = await strict.fit_chat(messages, max_tokens=100)
    assert fitted.max_tokens == 100 and fitted.report.max_tokens_source == "client"
    assert "drop_turns" in fitted.report.steps
    assert len(fitted.prompts[0]) + 100 <= prompt + 40
    # Text prompts: cut to leave the 50 asked for, not 16.
    ids = list(range(1, 201))
    cut = await budget(
        hf_tokenizer, 100, overflow="error", completion_truncation="auto"
    ).fit_prompts([ids], max_tokens=50, keep_prefix=1)
    assert cut.max_tokens == 50 and len(cut.prompts[0]) == 50
    # When nothing can make the room, the 400 gives the prompt as sent.
    with pytest.raises(ContextLengthExceededError) as caught:
        await strict.fit_chat(messages, max_tokens=prompt + 41)
    assert f"({prompt} in the messages, {prompt + 41} in the completion)" in str(caught.value)


def test_a_text_prompt_too_long_by_its_characters_is_refused_or_cut_before_tokenizing(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    budget = TokenBudget(hf_tokenizer, 100, BudgetPolicy())
    short = "word " * 10
    assert budget.bound_text(short) is short
    huge = "a" * 100 * 128 + "THE END"
    with pytest.raises(ContextLengthExceededError) as refused:
        budget.bound_text(huge)
    assert refused.value.param == "prompt" and "characters" in refused.value.message
    kept = budget.bound_text(huge, truncation="auto")
    assert len(kept) == 100 * 128 and kept.endswith("THE END")


async def test_a_chat_too_long_by_its_characters_is_bounded_not_tokenized_whole(
    hf_tokenizer: HFPromptTokenizer,
) -> None:
    messages = [
        {"role": "user", "content": "Old. " * 200_000},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Now?"},
    ]
    encoding = await hf_tokenizer.encode_chat_counted(messages, ids_up_to=500)
    assert encoding.ids == [] and encoding.length > 500
    # The giant content counts as its length in bytes, an upper bound; the rest exactly.
    assert encoding.content_tokens[0] == len(messages[0]["content"])
    assert encoding.content_tokens[1:] == tuple(await hf_tokenizer.count(["Yes.", "Now?"]))
    fitted = await TokenBudget(hf_tokenizer, 600, BudgetPolicy()).fit_chat(messages, max_tokens=16)
    assert len(fitted.prompts[0]) <= 600 - 16
    assert fitted.report.steps[-1] == "cut_turn"
