"""A Responses request as the chat request it runs as, and what it refuses: its reasoning
options, `include`, and reasoning items sent back sealed, opened with the gateway's seal."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sluicegate.errors import InvalidRequestError
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.response_body import identified
from sluicegate.wire.response_items import chat_messages
from sluicegate.wire.responses import ResponsesRequest, chat_body, param_for

SEAL = ReasoningSeal([b"k" * 32])


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def refused_param(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    return ".".join(str(p) for p in caught.value.errors()[0]["loc"])


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    body = chat_body(request(instructions="Be brief."), [])
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_message_items_keep_their_roles_and_join_their_text_parts() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
    ]
    assert chat_body(request(input=items), [])["messages"] == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c"},
    ]


def test_function_calls_become_one_assistant_message_and_outputs_tool_messages() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"x":1}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"text": "rain"}]},
    ]
    messages = chat_messages(request(input=items).input_items())
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"x":1}'}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{}"}},
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]


def test_a_function_call_after_assistant_text_joins_that_message() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "t"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]
    assistant = chat_messages(history)[1]
    assert assistant["content"] == "t" and assistant["tool_calls"][0]["id"] == "c"


def test_history_comes_before_the_new_input_and_instructions_before_both() -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
    ]
    body = chat_body(request(input="second", instructions="new"), history)
    assert [m["content"] for m in body["messages"]] == ["new", "first", "A", "second"]


def test_parameters_map_to_their_chat_names() -> None:
    body = chat_body(
        request(
            max_output_tokens=7,
            temperature=0.5,
            top_p=0.9,
            user="u",
            stream=True,
            truncation="auto",
        ),
        [],
    )
    assert body["max_completion_tokens"] == 7
    assert (body["temperature"], body["top_p"], body["user"]) == (0.5, 0.9, "u")
    assert body["stream"] is True and body["truncation"] == "auto"
    assert "response_format" not in body and "tools" not in body


def test_truncation_defaults_to_disabled_as_openai() -> None:
    assert chat_body(request(), [])["truncation"] == "disabled"


def test_function_tools_and_tool_choice_take_the_chat_shape() -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    }
    body = chat_body(
        request(
            tools=[tool],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
        ),
        [],
    )
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": tool["parameters"],
                "strict": True,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert chat_body(request(tools=[tool], tool_choice="required"), [])["tool_choice"] == (
        "required"
    )


def test_json_schema_text_format_becomes_the_chat_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    text = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    body = chat_body(request(text=text), [])
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert request(text=text).echo()["text"]["format"] == {
        "type": "json_schema",
        "name": "thing",
        "schema": schema,
        "strict": True,
    }


def test_json_object_and_text_formats() -> None:
    assert chat_body(request(text={"format": {"type": "json_object"}}), [])["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in chat_body(request(text={"format": {"type": "text"}}), [])


def test_a_json_schema_format_needs_a_name_and_a_schema() -> None:
    assert refused_param(text={"format": {"type": "json_schema", "name": "x"}}) == "text.format"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"input": [{"type": "input_file", "file_id": "f"}]}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input"),
        ({"input": []}, "input"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "\ud800"}, "input"),
    ],
)
def test_what_this_server_cannot_do_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    assert refused_param(**fields).startswith(param)


def refusal(*items: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        request(input=list(items))
    return str(caught.value.errors()[0]["msg"])


def test_a_function_call_output_takes_only_its_own_fields() -> None:
    output = {"type": "function_call_output", "call_id": "c", "output": "sunny"}
    assert "input[1].note is not a field of a function_call_output item" in refusal(
        {"role": "user", "content": "q"}, {**output, "note": "x" * 1000}
    )
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b", "x": {}}]
    assert "input[0].output[1].x is not a field of a text part" in refusal(
        {**output, "output": parts}
    )
    image = [{"type": "input_image", "text": "a", "image_url": "data:,"}]
    assert "input[0].output[0]: only input_text parts" in refusal({**output, "output": image})
    assert "input[0].status must be one of" in refusal({**output, "status": "done"})
    # What `GET .../input_items` lists, sent back as it is, is taken.
    listed = {**output, "id": "fco_1", "status": "completed"}
    assert request(input=[listed]).input_items() == [listed]


def test_a_function_call_outputs_parts_are_stored_as_text_parts_only() -> None:
    items = [
        {"type": "function_call_output", "call_id": "c1", "output": [{"text": "rain"}]},
        {"type": "function_call_output", "call_id": "c2", "output": "sun", "status": "completed"},
    ]
    stored = identified(request(input=items).input_items())
    assert [{k: v for k, v in item.items() if k != "id"} for item in stored] == [
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "rain"}],
        },
        {"type": "function_call_output", "call_id": "c2", "output": "sun"},
    ]


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_reasoning_effort_is_the_chat_requests_and_is_echoed(effort: str) -> None:
    asked = request(reasoning={"effort": effort})
    assert chat_body(asked, [])["reasoning_effort"] == effort
    assert asked.echo()["reasoning"] == {"effort": effort, "summary": None}


def test_without_reasoning_the_chat_request_sets_no_effort() -> None:
    assert "reasoning_effort" not in chat_body(request(), [])
    assert "reasoning_effort" not in chat_body(request(reasoning={"summary": "auto"}), [])
    assert request().echo()["reasoning"] == {"effort": None, "summary": None}


@pytest.mark.parametrize("summary", ["auto", "concise", "detailed"])
def test_a_summary_is_accepted_and_echoed_under_either_name(summary: str) -> None:
    assert request(reasoning={"summary": summary}).echo()["reasoning"]["summary"] == summary
    older = request(reasoning={"effort": "low", "generate_summary": summary})
    assert older.echo()["reasoning"] == {"effort": "low", "summary": summary}


def test_include_takes_the_sealed_reasoning_and_nothing_else() -> None:
    assert request(include=["reasoning.encrypted_content"]).seals_reasoning
    assert not request(include=[]).seals_reasoning and not request().seals_reasoning
    with pytest.raises(ValidationError) as caught:
        request(include=["reasoning.encrypted_content", "code_interpreter_call.outputs"])
    assert "'code_interpreter_call.outputs' is not supported" in str(caught.value)


def sent_back(text: str, **fields: Any) -> list[dict[str, Any]]:
    """A turn as a stateless client sends it back: its reasoning item, sealed, then its text."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], **fields}
    reasoning.setdefault("encrypted_content", SEAL.seal(text))
    return [
        {"role": "user", "content": "q"},
        reasoning,
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "again"},
    ]


def test_sealed_reasoning_is_opened_into_the_turns_reasoning() -> None:
    opened = request(input=sent_back("I thought.", content=None)).opened(SEAL)
    assert chat_body(opened, [])["messages"][1] == {
        "role": "assistant",
        "content": "a",
        "reasoning": "I thought.",
    }
    assert opened.input_items()[1]["encrypted_content"] is None  # stored as the text it held
    # The sealed text wins over a `content` sent beside it.
    sent = request(input=sent_back("Sealed.", content=[{"type": "reasoning_text", "text": "x"}]))
    assert chat_body(sent.opened(SEAL), [])["messages"][1]["reasoning"] == "Sealed."


def test_a_request_without_sealed_items_is_left_as_it_is() -> None:
    plain = request(input=sent_back("x", encrypted_content=None))
    assert plain.opened(SEAL) is plain
    assert request().opened(SEAL).input == "hi"


@pytest.mark.parametrize(
    "token",
    [
        ReasoningSeal([b"o" * 32]).seal("Another gateway's."),
        SEAL.sign("A signature, not a seal."),
        SEAL.seal("x")[:-4] + "AAAA",
        "gAAAAABopenai-encrypted-content",
    ],
    ids=["another-key", "a-signature", "tampered", "openais"],
)
def test_a_seal_this_gateway_did_not_make_is_a_400_naming_the_item(token: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        request(input=sent_back("x", encrypted_content=token)).opened(SEAL)
    assert caught.value.param == "input[1].encrypted_content"
    assert caught.value.code == "invalid_encrypted_content" and "input[1]" in caught.value.message


def test_chat_params_name_the_responses_params() -> None:
    assert param_for("messages.3.role") == "input"
    assert param_for("max_tokens") == "max_output_tokens"
    assert param_for("response_format.json_schema") == "text.format"
    assert param_for("tools") == "tools"
    assert param_for("reasoning_effort") == "reasoning.effort"


def test_the_echo_repeats_the_request_parameters() -> None:
    echo = request(instructions="i", max_output_tokens=5, metadata={"a": "b"}, store=False).echo()
    assert echo["instructions"] == "i" and echo["max_output_tokens"] == 5
    assert echo["metadata"] == {"a": "b"} and echo["store"] is False
    assert echo["tool_choice"] == "auto" and echo["tools"] == []
    assert echo["text"]["format"] == {"type": "text"}


def test_input_images_are_chat_image_parts_of_user_messages_only() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "high"}
    text = {"type": "input_text", "text": "look"}
    body = chat_body(request(input=[{"role": "user", "content": [text, image]}]), [])
    assert body["messages"][-1]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "high"}},
    ]
    assert "images are read in user messages only" in refusal(
        {"role": "system", "content": [image]}
    )
    assert "input[0].content[0].file_id" in refusal(
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}
    )
    assert "input[0].content[0].detail" in refusal(
        {"role": "user", "content": [{**image, "detail": "huge"}]}
    )
