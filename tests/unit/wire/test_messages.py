"""A Messages request as the chat request it runs as."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.wire.messages import (
    MessagesRequest,
    UnsupportedBlockError,
    chat_body,
    param_for,
)


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


def test_a_block_the_model_cannot_read_is_refused_where_it_is() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    turns = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    with pytest.raises(UnsupportedBlockError) as caught:
        chat_body(request(messages=turns))
    assert caught.value.param == "messages.0.content.1" and "text only" in str(caught.value)


def test_thoughts_of_an_earlier_turn_are_left_out() -> None:
    turns = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Hello"},
            ],
        },
        {"role": "user", "content": "again"},
    ]
    assert chat_body(request(messages=turns))["messages"][1] == {
        "role": "assistant",
        "content": "Hello",
    }


def test_chat_parameters_name_the_messages_ones() -> None:
    assert param_for("stop.0") == "stop_sequences"
    assert param_for("messages.3.content") == "messages"
    assert param_for("max_completion_tokens") == "max_tokens"
    assert param_for("temperature") == "temperature"
