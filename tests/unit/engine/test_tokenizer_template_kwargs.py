"""The chat template's keyword arguments and earlier turns' thoughts, through the tokenizer and
the token budget, with the bundled model's tokenizer and the reasoning variant's template
(`tests.support.reasoning_model`: `enable_thinking` closes the think block)."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.engine.tokenizer import HFPromptTokenizer, _chat_size
from sluicegate.errors import InvalidRequestError
from sluicegate.inference.budget import BudgetPolicy, TokenBudget
from tests.support.reasoning_model import reasoning_template

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tokenizer() -> HFPromptTokenizer:
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    hf = AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))
    return HFPromptTokenizer(hf, chat_template=reasoning_template())


def with_thought(thought: str) -> list[dict[str, Any]]:
    # One name, as a client sends it: the template is given both.
    answer = {"role": "assistant", "content": "Paris.", "reasoning_content": thought}
    return [*QUESTION, answer, {"role": "user", "content": "And of Italy?"}]


async def test_the_kwargs_reach_the_template(tokenizer: HFPromptTokenizer) -> None:
    on = await tokenizer.render_chat(QUESTION)
    off = await tokenizer.render_chat(QUESTION, template_kwargs=OFF)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = await tokenizer.encode_chat(QUESTION, template_kwargs=OFF)
    assert ids == tokenizer._encode_rendered(off)
    counted = await tokenizer.encode_chat_counted(QUESTION, template_kwargs=OFF)
    assert counted.ids == ids
    # Not the memo's answer for the same messages without them.
    assert (await tokenizer.encode_chat_counted(QUESTION)).ids != ids


async def test_kwargs_the_template_does_not_read_are_left_out(
    tokenizer: HFPromptTokenizer,
) -> None:
    assert tokenizer.template_arguments({"enable_thinking": False, "unused": 1}) == OFF
    plain = await tokenizer.encode_chat_counted(QUESTION)
    ignored = await tokenizer.encode_chat_counted(QUESTION, template_kwargs={"unused": 1})
    assert ignored.ids == plain.ids


async def test_earlier_thoughts_are_rendered_and_keyed(tokenizer: HFPromptTokenizer) -> None:
    one = await tokenizer.encode_chat_counted(with_thought("France's capital is Paris."))
    other = await tokenizer.encode_chat_counted(with_thought("Surely Paris."))
    assert one.ids != other.ids  # the memo tells them apart
    text = await tokenizer.render_chat(with_thought("France's capital is Paris."))
    assert "France's capital is Paris." in text and "</think>" not in text


def test_thoughts_weigh_on_the_size_that_moves_work_off_the_loop() -> None:
    thought = "x" * 10_000
    assert _chat_size(with_thought(thought)) >= _chat_size(with_thought("")) + len(thought)


async def test_a_long_history_of_thoughts_is_bounded_not_tokenized(
    tokenizer: HFPromptTokenizer,
) -> None:
    """Beyond what could fit, a huge thought counts as its length (an upper bound), as huge
    contents do, and the whole is not encoded."""
    thought = "word " * 100_000
    bounded = await tokenizer.encode_chat_counted(with_thought(thought), ids_up_to=100)
    assert bounded.ids == []
    assert bounded.length >= len(thought.split())
    assert bounded.length <= len(thought) + 1000


async def test_the_budget_renders_with_the_kwargs(tokenizer: HFPromptTokenizer) -> None:
    budget = TokenBudget(tokenizer, 2048, BudgetPolicy())
    fitted = await budget.fit_chat(QUESTION, max_tokens=16, template_kwargs=OFF)
    assert fitted.prompts == [await tokenizer.encode_chat(QUESTION, template_kwargs=OFF)]
    # Truncating renders with them too.
    long = [{"role": "user", "content": "Tell me about Paris. " * 40}, *QUESTION]
    long = [long[0], {"role": "assistant", "content": "Paris is big."}, long[1]]
    small = TokenBudget(tokenizer, 120, BudgetPolicy())
    cut = await small.fit_chat(long, max_tokens=16, template_kwargs=OFF)
    assert cut.report is not None and cut.report.trimmed
    kept = cut.messages or []
    assert cut.prompts == [await tokenizer.encode_chat(kept, template_kwargs=OFF)]


async def test_a_template_failing_on_the_clients_kwargs_is_a_400_naming_them() -> None:
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    hf = AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))
    # As Llama 3's templates add a date string to text: a number there is a TypeError.
    template = "{{ 'Today: ' + date_string }}{% for m in messages %}{{ m.content }}{% endfor %}"
    tokenizer = HFPromptTokenizer(hf, chat_template=template)
    assert await tokenizer.render_chat(QUESTION, template_kwargs={"date_string": "1 May"})
    with pytest.raises(InvalidRequestError) as caught:
        await tokenizer.render_chat(QUESTION, template_kwargs={"date_string": 5})
    assert caught.value.param == "chat_template_kwargs"


async def test_the_template_gets_the_thoughts_under_both_names(
    tokenizer: HFPromptTokenizer,
) -> None:
    by_new_name = await tokenizer.render_chat(
        [*QUESTION, {"role": "assistant", "content": "Paris.", "reasoning": "Easy."}]
    )
    by_old_name = await tokenizer.render_chat(
        [*QUESTION, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."}]
    )
    assert by_new_name == by_old_name and "Easy." in by_new_name
