"""The shipped SmolLM2 template with tools, against the model's own (the real tokenizer)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sluicegate.engine.model import bundled_model_dir, shipped_template
from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.inference.budget import BudgetPolicy, TokenBudget
from sluicegate.settings import Settings

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))


def render(hf: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(hf.apply_chat_template(messages, tokenize=False, **kwargs))


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "a\n\n b  "},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": ""},
        {"role": "system", "content": "late system"},
    ],
    [{"role": "assistant", "content": "starts with the assistant"}],
    [{"role": "user", "content": "<tool_call>not a call</tool_call> {{ braces }} é"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("generation", [True, False])
def test_without_tools_it_renders_exactly_as_smollm2s_own(
    hf: Any, messages: list[dict[str, Any]], generation: bool
) -> None:
    own = render(hf, messages, add_generation_prompt=generation)
    ours = render(hf, messages, add_generation_prompt=generation, chat_template=shipped_template())
    assert ours == own


def test_tools_go_first_in_the_system_turn_the_hermes_way(hf: Any) -> None:
    text = render(
        hf,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tools=[WEATHER],
        add_generation_prompt=True,
        chat_template=shipped_template(),
    )
    system, user = text.split("<|im_end|>\n")[:2]
    assert system.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in system
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        in system
    )
    assert system.endswith("\n\nBe brief.")
    assert user == "<|im_start|>user\nHi"
    assert text.endswith("<|im_start|>assistant\n")
    default = render(
        hf, [{"role": "user", "content": "Hi"}], tools=[WEATHER], chat_template=shipped_template()
    )
    assert "You are a helpful AI assistant named SmolLM" in default.split("<|im_end|>")[0]


def test_calls_and_results_render_as_blocks_and_null_content_is_empty(hf: Any) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
    }
    text = render(
        hf,
        [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [call, call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c1", "content": "warm"},
            {"role": "assistant", "content": None},
        ],
        chat_template=shipped_template(),
    )
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{block}\n{block}<|im_end|>\n" in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nwarm\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n<|im_end|>\n")


async def test_the_memo_tells_conversations_with_other_tools_or_calls_apart(hf: Any) -> None:
    tokenizer = HFPromptTokenizer(hf, chat_template=shipped_template())
    messages = [{"role": "user", "content": "Hi"}]
    plain = await tokenizer.encode_chat_counted(messages)
    with_tools = await tokenizer.encode_chat_counted(messages, tools=[WEATHER])
    assert with_tools.length > plain.length
    assert (await tokenizer.encode_chat_counted(messages)).ids == plain.ids
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {}}}
    a = await tokenizer.encode_chat_counted(
        [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
    )
    b = await tokenizer.encode_chat_counted([*messages, {"role": "assistant", "content": ""}])
    assert a.ids != b.ids
    tokenizer.close()


async def test_the_budget_counts_the_tools_and_never_truncates_them_away(hf: Any) -> None:
    tokenizer = HFPromptTokenizer(hf, chat_template=shipped_template())
    tools = [WEATHER] * 3
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "words " * 40}
        for i in range(12)
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        *turns,
        {"role": "user", "content": "Last?"},
    ]
    full = await tokenizer.encode_chat(messages, tools)
    limit_room = 64
    budget = TokenBudget(
        tokenizer, len(full) // 2 + limit_room, BudgetPolicy(min_completion_tokens=limit_room)
    )
    fitted = await budget.fit_chat(messages, max_tokens=limit_room, tools=tools)
    ids = fitted.prompts[0]
    assert fitted.report.prompt_tokens_before == len(full)
    assert fitted.report.messages_dropped > 0
    assert len(ids) <= len(full) // 2
    text = hf.decode(ids)
    assert text.count(json.dumps(WEATHER)) == 3, "the tools are all still there"
    assert "Be brief." in text and text.endswith("Last?<|im_end|>\n<|im_start|>assistant\n")
    # The tools count as fixed, not as a message's: dropping turns is not expected to free
    # them, so no more turns go than needed (a turn here is about 90 tokens, the tools 150).
    assert len(ids) > len(full) // 2 - 90, (len(ids), len(full) // 2)
    tokenizer.close()


async def test_tools_that_leave_no_room_are_a_400_that_names_them(hf: Any) -> None:
    from sluicegate.errors import ContextLengthExceededError

    tokenizer = HFPromptTokenizer(hf, chat_template=shipped_template())
    messages = [{"role": "user", "content": "Hi"}]
    alone = len(await tokenizer.encode_chat(messages))
    budget = TokenBudget(tokenizer, alone + 32, BudgetPolicy(min_completion_tokens=16))
    assert (await budget.fit_chat(messages, max_tokens=16)).report.prompt_tokens_after == alone
    with pytest.raises(ContextLengthExceededError) as caught:
        await budget.fit_chat(messages, max_tokens=16, tools=[WEATHER] * 2)
    assert caught.value.param == "messages" and "tools" in caught.value.message
    tokenizer.close()


def test_a_conversation_the_template_refuses_is_a_400_on_messages() -> None:
    from transformers import AutoTokenizer

    from sluicegate.errors import InvalidRequestError

    folder = bundled_model_dir(Settings(_env_file=None).model_cache_dir)  # type: ignore[call-arg]
    refusing = HFPromptTokenizer(
        AutoTokenizer.from_pretrained(folder),
        chat_template="{{ raise_exception('only one tool call per message') }}",
    )
    try:
        with pytest.raises(InvalidRequestError) as caught:
            refusing.render([{"role": "user", "content": "hi"}])
        assert caught.value.param == "messages"
        assert "only one tool call per message" in caught.value.message
    finally:
        refusing.close()


def test_tool_call_arguments_weigh_as_their_length() -> None:
    from sluicegate.engine.tokenizer import _chat_size

    arguments = {"text": "x" * 100_000}
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert _chat_size([message]) > 100_000
