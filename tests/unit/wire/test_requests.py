from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from sluicegate.http.errors import validation_param
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_text_parts_join_with_newlines() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            **BASE,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
        }
    )
    assert request.messages[0].text() == "a\nb"


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": float("nan")},
        {"top_p": float("inf")},
        {"seed": 2**64},
        {"top_logprobs": 3},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user"}]},
        {"stop": ["ok", ""]},
        {"logit_bias": {"x": 2.0}},
        {"response_format": {"type": "json_schema"}},
        {"response_format": {"type": "xml"}},
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        {"structured_outputs": {}},
        {"structured_outputs": {"structural_tag": "{}", "regex": "a"}},
        {"n": 1000},
    ],
)
def test_bad_chat_requests_are_refused(extra: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({**BASE, **extra})


def test_unknown_fields_are_ignored() -> None:
    assert ChatCompletionRequest.model_validate({**BASE, "frobnicate": 1}).model == "m"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    request = ChatCompletionRequest.model_validate(
        {**BASE, "max_tokens": 9, "max_completion_tokens": 4}
    )
    assert request.completion_limit() == 4


def test_logprobs_k() -> None:
    assert ChatCompletionRequest.model_validate(BASE).logprobs_k() is None
    assert ChatCompletionRequest.model_validate({**BASE, "logprobs": True}).logprobs_k() == 0
    chat = ChatCompletionRequest.model_validate({**BASE, "logprobs": True, "top_logprobs": 5})
    assert chat.logprobs_k() == 5
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 2}).logprobs_k()
        == 2
    )


@pytest.mark.parametrize("prompt", [[], [[]], ["a", []]])
def test_empty_prompts_are_refused(prompt: object) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})


@pytest.mark.parametrize("option", [{"suffix": "x"}, {"best_of": 3}])
def test_unsupported_completion_options_are_refused(option: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="not supported"):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", **option})


def test_validation_param_drops_type_parts() -> None:
    assert validation_param(("body", "messages", 0, "content", "str")) == "messages.0.content"
    assert (
        validation_param(("body", "messages", 0, "content", "list[TextPart]", 0, "type"))
        == "messages.0.content.0.type"
    )
    assert validation_param(("body",)) == ""


def first_error(model: type[ChatCompletionRequest | CompletionRequest], raw: str) -> dict[str, Any]:
    """The error the API renders for `raw` (JSON), parsed the way FastAPI parses bodies."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(json.loads(raw))
    error = dict(caught.value.errors()[0])
    error["param"] = validation_param(("body", *error["loc"]))
    return error


CHAT_START = '{"model": "m", "messages": [{"role": "user", '


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (CHAT_START + '"content": "a\\ud800b"}]}', "messages.0.content"),
        (CHAT_START + '"content": "\\udfff"}]}', "messages.0.content"),
        (CHAT_START + '"content": [{"type": "text", "text": "ok"}, '
         '{"type": "text", "text": "\\ud83d"}]}]}', "messages.0.content.1.text"),
        (CHAT_START + '"content": "hi", "name": "\\ud800"}]}', "messages.0.name"),
        (CHAT_START + '"content": "hi"}], "stop": "\\ud800"}', "stop"),
        (CHAT_START + '"content": "hi"}], "stop": ["ok", "x\\udc00"]}', "stop.1"),
        (CHAT_START + '"content": "hi"}], "user": "\\ud800"}', "user"),
        ('{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    ],
)  # fmt: skip
def test_lone_surrogates_in_chat_text_are_refused_naming_the_field(raw: str, param: str) -> None:
    error = first_error(ChatCompletionRequest, raw)
    assert error["param"] == param
    assert "surrogate" in error["msg"]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "m", "prompt": "\\ud800"}', "prompt"),
        ('{"model": "m", "prompt": ["fine", "\\udbff tail"]}', "prompt.1"),
        ('{"model": "m", "prompt": "x", "stop": ["\\ud800"]}', "stop.0"),
    ],
)
def test_lone_surrogates_in_prompts_are_refused(raw: str, param: str) -> None:
    error = first_error(CompletionRequest, raw)
    assert error["param"] == param
    assert "surrogate" in error["msg"]


def test_surrogate_pairs_and_other_unicode_are_text() -> None:
    raw = CHAT_START + '"content": "\\ud83d\\ude00 caf\\u00e9 \\u5b57", "name": "\\u00e9"}]}'
    request = ChatCompletionRequest.model_validate(json.loads(raw))
    assert request.messages[0].text() == "\N{GRINNING FACE} café 字"
    prompt = CompletionRequest.model_validate({"model": "m", "prompt": ["é", "\N{GRINNING FACE}"]})
    assert prompt.prompts() == ["é", "\N{GRINNING FACE}"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": 2**31}, "top_k"),
        ({"top_k": 2**64}, "top_k"),
        ({"top_k": 10**30}, "top_k"),
        ({"min_tokens": 2**63}, "min_tokens"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"max_completion_tokens": 2**63}, "max_completion_tokens"),
    ],
)
def test_integers_beyond_what_the_engine_stores_are_refused(
    extra: dict[str, object], param: str
) -> None:
    error = first_error(ChatCompletionRequest, json.dumps({**BASE, **extra}))
    assert error["param"] == param


def test_the_largest_accepted_integers_validate() -> None:
    request = ChatCompletionRequest.model_validate(
        {**BASE, "top_k": 2**31 - 1, "seed": -(2**63), "min_tokens": 2**63 - 1}
    )
    assert (request.top_k, request.seed, request.min_tokens) == (2**31 - 1, -(2**63), 2**63 - 1)


# ---- tool messages ---------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOOL_TURNS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
]


def test_tool_turns_reach_the_template_with_their_fields() -> None:
    request = ChatCompletionRequest.model_validate({**BASE, "messages": TOOL_TURNS})
    assert request.prompt_messages()[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": {"a": 1}},
                }
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]


def test_legacy_function_messages_become_tool_turns() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            **BASE,
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "f", "arguments": "{}"},
                },
                {"role": "function", "name": "f", "content": "ok"},
            ],
        }
    )
    assistant, result = request.prompt_messages()
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {}}
    assert result == {"role": "tool", "content": "ok", "name": "f"}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "42"}, "messages.0"),
        ({"role": "tool", "tool_call_id": "c"}, "messages.0"),
        ({"role": "function", "content": "x"}, "messages.0"),
        ({"role": "user", "content": "x", "tool_calls": [CALL]}, "messages.0"),
        (
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"a": 1}}}],
            },
            "messages.0.tool_calls.0.function.arguments",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": CALL["function"]}],
            },
            "messages.0.tool_calls.0.id",
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "type": "code"}]},
            "messages.0.tool_calls.0.type",
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "id": "\ud800"}]},
            "messages.0.tool_calls.0.id",
        ),
        ({"role": "tool", "tool_call_id": "\udfff", "content": "x"}, "messages.0.tool_call_id"),
    ],
)
def test_bad_tool_messages_are_refused_at_their_field(message: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({**BASE, "messages": [message]})
    assert validation_param(("body", *caught.value.errors()[0]["loc"])) == param


def test_compact_bodies_keep_tool_fields() -> None:
    from sluicegate.wire.compact import compact_body

    body = {
        **BASE,
        "messages": [*TOOL_TURNS, {"role": "user", "content": [{"type": "text", "text": "a"}]}],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    original = ChatCompletionRequest.model_validate(body)
    compact = compact_body(ChatCompletionRequest, json.dumps(body).encode())
    assert compact.data is not None
    again = ChatCompletionRequest.model_validate(compact.data)
    assert again.prompt_messages() == original.prompt_messages()
    assert again.tools == original.tools and again.tool_choice == "required"
    assert again.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("web_search_options", {}),
    ],
)
def test_output_a_text_model_cannot_give_is_refused_not_ignored(field: str, value: object) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    assert caught.value.errors()[0]["loc"] == (field,)


def test_text_modalities_and_ignored_hints_are_accepted() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "modalities": ["text"],
        "metadata": {"team": "a"},
        "store": False,
        "service_tier": "auto",
        "prompt_cache_key": "k",
        "prediction": {"type": "content", "content": "x"},
    }
    assert ChatCompletionRequest.model_validate(body).modalities == ["text"]
