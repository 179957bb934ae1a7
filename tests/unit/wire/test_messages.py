"""A Messages request as the chat request it runs as."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from sluicegate.wire.message_thinking import SignedThought
from sluicegate.wire.messages import (
    CountTokensRequest,
    MessagesRequest,
    UnsupportedBlockError,
    chat_body,
    param_for,
)
from sluicegate.wire.reasoning_seal import text_digest


def request(**extra: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], **extra}
    )


def test_turns_tool_uses_and_tool_results_become_chat_messages() -> None:
    body = chat_body(
        request(
            system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            messages=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "Sunny"}],
                        },
                        {"type": "text", "text": "Thanks."},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": "boom",
                            "is_error": True,
                        }
                    ],
                },
            ],
        )
    )
    assert body["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "user", "content": "Thanks."},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
    ]
    assert body["max_tokens"] == 32 and body["stream"] is False


@pytest.mark.parametrize(
    ("choice", "chat", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
            None,
        ),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ],
)
def test_tool_choice_maps_to_the_chat_one(
    choice: dict[str, Any], chat: object, parallel: bool | None
) -> None:
    tool = {"name": "weather", "input_schema": {"properties": {"city": {"type": "string"}}}}
    body = chat_body(request(tools=[tool], tool_choice=choice))
    assert body["tool_choice"] == chat
    assert body.get("parallel_tool_calls") == parallel
    assert body["tools"][0]["function"]["parameters"]["type"] == "object"


def test_sampling_stop_and_metadata_map_to_their_chat_names() -> None:
    body = chat_body(
        request(
            temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["END"],
            metadata={"user_id": "u-1"}, stream=True,
        )
    )  # fmt: skip
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.5, 0.9, 40)
    assert body["stop"] == ["END"] and body["user"] == "u-1"
    assert body["stream_options"] == {"include_usage": True}


def test_image_blocks_are_chat_image_parts_in_user_turns() -> None:
    base64_image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    by_url = {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/a.png"}}
    turns = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, base64_image, by_url]},
    ]
    converted = request(messages=turns)
    body = converted.convert()
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}},
    ]
    assert converted.image_params() == ("messages.1.content.1", "messages.1.content.2")
    # Kept by the compact form a worker process sends back.
    assert converted.converted().image_params() == converted.image_params()


@pytest.mark.parametrize(
    ("turn", "param", "words"),
    [
        (
            {"role": "user", "content": [{"type": "document", "source": {}}]},
            "messages.0.content.0",
            "text only",
        ),
        (
            {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]},
            "messages.0.content.0.source",
            "base64",
        ),
        (
            {"role": "assistant", "content": [{"type": "image", "source": {}}]},
            "messages.0.content.0",
            "user turns only",
        ),
        (
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "image", "source": {}}],
                    }
                ],
            },
            "messages.0.content.0.content.0",
            "tool results",
        ),
    ],
)
def test_a_block_the_model_cannot_read_is_refused_where_it_is(
    turn: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(UnsupportedBlockError) as caught:
        chat_body(request(messages=[turn]))
    assert caught.value.param == param and words in str(caught.value)


def thinking_turns(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    """A user turn, an assistant turn of `blocks` then text, and a user turn."""
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [*blocks, {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "again"},
    ]


def test_thinking_blocks_are_the_turns_reasoning_and_recorded_to_verify() -> None:
    sent = request(
        messages=thinking_turns(
            {"type": "thinking", "thinking": "First, ", "signature": "sig-a"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": "then.", "signature": "sig-b"},
        )
    )
    # Several blocks are one text, joined as vLLM's server joins them; redacted ones dropped.
    assert sent.chat_body()["messages"][1] == {
        "role": "assistant",
        "content": "Hello",
        "reasoning": "First, then.",
    }
    assert sent.signed_thoughts() == (
        SignedThought("messages.1.content.0.signature", text_digest("First, "), "sig-a"),
        SignedThought("messages.1.content.2.signature", text_digest("then."), "sig-b"),
    )


def test_the_thoughts_to_verify_survive_the_worker_process_conversion() -> None:
    turns = thinking_turns({"type": "thinking", "thinking": "Hmm.", "signature": "sig"})
    sent = request(messages=turns)
    back = pickle.loads(pickle.dumps(sent.converted()))
    assert back.messages == []
    assert back.signed_thoughts() == (
        SignedThought("messages.1.content.0.signature", text_digest("Hmm."), "sig"),
    )
    assert back.chat_body()["messages"][1]["reasoning"] == "Hmm."


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "thinking", "thinking": "Hm"}, "messages.1.content.0.signature"),
        ({"type": "thinking", "thinking": "Hm", "signature": 7}, "messages.1.content.0.signature"),
        ({"type": "thinking", "signature": "sig"}, "messages.1.content.0.thinking"),
    ],
)
def test_a_thinking_block_without_its_text_or_signature_is_refused_where_it_is(
    block: dict[str, Any], param: str
) -> None:
    with pytest.raises(UnsupportedBlockError) as caught:
        chat_body(request(messages=thinking_turns(block)))
    assert caught.value.param == param


def test_thinking_in_a_user_turn_is_refused() -> None:
    turns = [{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}]
    with pytest.raises(UnsupportedBlockError) as caught:
        chat_body(request(messages=turns))
    assert caught.value.param == "messages.0.content.0"


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, {"thinking_token_budget": 1024}),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2000, "display": "omitted"}},
            {"thinking_token_budget": 2000},
        ),
        ({"thinking": {"type": "disabled"}}, {"reasoning_effort": "none"}),
        ({"thinking": {"type": "adaptive", "display": "summarized"}}, {}),
        ({"output_config": {"effort": "high"}}, {"reasoning_effort": "high"}),
        (
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
            {"reasoning_effort": "max"},
        ),
        # As vLLM's server: disabled thinking wins over an effort.
        (
            {"thinking": {"type": "disabled"}, "output_config": {"effort": "low"}},
            {"reasoning_effort": "none"},
        ),
        ({}, {}),
    ],
)
def test_thinking_and_effort_become_the_chat_reasoning_fields(
    extra: dict[str, Any], fields: dict[str, Any]
) -> None:
    body = chat_body(request(max_tokens=4096, temperature=0.7, top_p=0.9, top_k=20, **extra))
    got = {k: body[k] for k in ("reasoning_effort", "thinking_token_budget") if k in body}
    assert got == fields
    # Sampling stays with thinking on, as vLLM's server allows it.
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 20)


def test_count_tokens_takes_thinking_and_gives_the_template_its_effort() -> None:
    turns = thinking_turns({"type": "thinking", "thinking": "Hmm.", "signature": "forged"})
    counted = CountTokensRequest.model_validate(
        {"model": "m", "messages": turns, "thinking": {"type": "disabled"}}
    ).chat_body()
    assert counted["reasoning_effort"] == "none"
    assert counted["messages"][1]["reasoning"] == "Hmm."
    budgeted = CountTokensRequest.model_validate(
        {"model": "m", "messages": turns, "thinking": {"type": "enabled", "budget_tokens": 9999}}
    ).chat_body()
    assert "thinking_token_budget" not in budgeted and "reasoning_effort" not in budgeted


def test_claude_codes_billing_header_is_left_out_of_the_system_prompt() -> None:
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=4f1e;"}
    system = [
        billing,
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    assert chat_body(request(system=system))["messages"][0] == {
        "role": "system",
        "content": "You are Claude Code.",
    }
    assert chat_body(request(system=[billing]))["messages"][0]["role"] == "user"


def test_chat_parameters_name_the_messages_ones() -> None:
    assert param_for("stop.0") == "stop_sequences"
    assert param_for("messages.3.content") == "messages"
    assert param_for("max_completion_tokens") == "max_tokens"
    assert param_for("temperature") == "temperature"
    assert param_for("thinking_token_budget") == "thinking.budget_tokens"
    assert param_for("reasoning_effort") == "output_config.effort"
