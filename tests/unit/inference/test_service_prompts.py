"""What an engine receives as a `Prompt`, over the fake engine: ids always, the chat and the
whole text for an engine that renders them itself, and nothing counted without a tokenizer."""

from __future__ import annotations

from sluicegate.engine.protocol import MAX_TOKEN_CHARS
from sluicegate.inference.service import CompletionService
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


async def test_a_whole_text_goes_as_text_and_a_cut_one_as_ids_only() -> None:
    engine = FakeEngine(max_model_len=64, renders_chat=True)
    service = CompletionService(engine, FAKE_MODEL)
    whole = CompletionRequest.model_validate({"model": FAKE_MODEL, "prompt": "one three"})
    (prompt,) = (await service.prepare_completion(whole)).prompts
    assert prompt.text == "one three" and prompt.ids == [3, 5]
    # More characters than the context could hold: cut before tokenizing, so not sent whole.
    long = "a " * (MAX_TOKEN_CHARS * 64)
    cut = CompletionRequest.model_validate(
        {"model": FAKE_MODEL, "prompt": long, "truncation": "auto", "max_tokens": 4}
    )
    (prompt,) = (await service.prepare_completion(cut)).prompts
    assert prompt.text is None and 0 < len(prompt.ids) <= 60


async def test_an_engine_that_renders_chats_gets_the_chat_and_the_tool_choice() -> None:
    engine = FakeEngine(max_model_len=256, renders_chat=True)
    service = CompletionService(engine, FAKE_MODEL)
    request = ChatCompletionRequest.model_validate(
        {
            "model": FAKE_MODEL,
            "messages": [{"role": "user", "content": "hi there"}],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "parallel_tool_calls": False,
        }
    )
    run = await service.prepare_chat(request)
    (prompt,) = run.prompts
    assert prompt.ids and prompt.chat is not None
    assert [m["content"] for m in prompt.chat.messages] == ["hi there"]
    assert prompt.chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert prompt.chat.parallel_tool_calls is False
    # The engine enforces the named call itself: no constraint from the gateway.
    assert run.options.structured is None
    in_process = CompletionService(FakeEngine(max_model_len=256), FAKE_MODEL)
    run = await in_process.prepare_chat(request)
    assert run.prompts[0].chat is None and run.options.structured is not None


async def test_without_a_tokenizer_nothing_is_counted_and_max_tokens_is_the_engines() -> None:
    engine = FakeEngine(max_model_len=64, renders_chat=True, tokenizer=None)  # type: ignore[arg-type]
    service = CompletionService(engine, FAKE_MODEL)
    ask = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    run = await service.prepare_chat(ChatCompletionRequest.model_validate(ask))
    assert run.prompts[0].ids == [] and run.prompt_tokens == 0 and run.budget is None
    assert not run.options.max_tokens_given
    given = await service.prepare_chat(
        ChatCompletionRequest.model_validate({**ask, "max_tokens": 5})
    )
    assert given.options.max_tokens_given and given.options.max_tokens == 5
