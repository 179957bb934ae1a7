"""Tool calling through real HTTP against the real engine (SmolLM2, the shipped template,
the `hermes` parser): forced calls validate against their parameters, streams add up to the
answers, tool turns are accepted, `auto` finds the model's own calls, bad input is a 400."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI

from tests.support.gateway import MODEL_NAME

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 9},
                "b": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# One earlier call in the conversation shows the model the format: it answers the next
# question with a <tool_call> of its own (greedy).
FEW_SHOT = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "user", "content": "Weather in Rome?"},
]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": ASK, "tools": TOOLS, "temperature": 0, **fields}


def post(base_url: str, payload: dict[str, Any], nocache: bool = True) -> httpx.Response:
    headers = {"cache-control": "no-cache"} if nocache else {}
    return httpx.post(f"{base_url}/v1/chat/completions", json=payload, headers=headers, timeout=180)


def calls_of(response: httpx.Response) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
    return choice, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def streamed(
    base_url: str, payload: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The stream's choice deltas, and the calls a client accumulating them ends with."""
    response = post(base_url, {**payload, "stream": True})
    assert response.status_code == 200, response.text
    choices = [
        json.loads(line[6:])["choices"][0]
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    calls: dict[int, list[str]] = {}
    for choice in choices:
        for call in choice["delta"].get("tool_calls") or []:
            if "id" in call:
                assert call["index"] not in calls, "each call opens once"
                assert call["type"] == "function" and call["function"]["arguments"] == ""
                calls[call["index"]] = [call["function"]["name"], ""]
            else:
                assert set(call) == {"index", "function"}
                calls[call["index"]][1] += call["function"]["arguments"]
    return choices, [(n, a) for n, a in (calls[i] for i in sorted(calls))]


def assert_valid(calls: list[tuple[str, str]]) -> None:
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


@pytest.mark.parametrize("name", ["get_weather", "add"])
def test_a_named_function_is_called_with_valid_arguments_streamed_or_not(
    base_url: str, name: str
) -> None:
    payload = body(tool_choice={"type": "function", "function": {"name": name}}, max_tokens=40)
    choice, calls = calls_of(post(base_url, payload))
    assert [n for n, _ in calls] == [name]
    assert_valid(calls)
    assert choice["message"]["content"] is None
    assert choice["finish_reason"] == "stop"  # OpenAI's for a named function
    chunks, stream_calls = streamed(base_url, payload)
    assert stream_calls == calls
    assert chunks[-1]["finish_reason"] == "stop"


def test_required_gives_valid_calls_streamed_or_not(base_url: str) -> None:
    payload = body(tool_choice="required", parallel_tool_calls=False, max_tokens=48)
    choice, calls = calls_of(post(base_url, payload))
    assert len(calls) == 1
    assert_valid(calls)
    assert choice["finish_reason"] == "tool_calls"
    chunks, stream_calls = streamed(base_url, payload)
    assert stream_calls == calls
    assert chunks[0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_legacy_functions_get_a_legacy_function_call(base_url: str) -> None:
    payload = {
        "model": MODEL_NAME,
        "messages": ASK,
        "functions": [ADD["function"]],
        "function_call": {"name": "add"},
        "temperature": 0,
        "max_tokens": 40,
    }
    response = post(base_url, payload)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    call = choice["message"]["function_call"]
    assert call["name"] == "add" and "tool_calls" not in choice["message"]
    jsonschema.validate(json.loads(call["arguments"]), PARAMETERS["add"])
    assert choice["finish_reason"] == "stop"


def test_a_cached_required_call_renders_the_same_calls(base_url: str) -> None:
    messages = [{"role": "user", "content": f"What is 2 plus 3? ({uuid.uuid4().hex[:8]})"}]
    payload = body(
        messages=messages, tool_choice="required", parallel_tool_calls=False, max_tokens=48
    )
    responses = [post(base_url, payload, nocache=False) for _ in range(3)]
    assert [r.headers["x-cache"] for r in responses] == ["MISS", "HIT", "HIT"]
    answers = [calls_of(r) for r in responses]
    assert answers[0][1] == answers[1][1] == answers[2][1]
    assert_valid(answers[0][1])
    assert all(choice["finish_reason"] == "tool_calls" for choice, _ in answers)
    ids = {r.json()["choices"][0]["message"]["tool_calls"][0]["id"] for r in responses}
    assert len(ids) == 3, "each response has its own call ids"


def test_auto_parses_the_models_own_tool_call(base_url: str) -> None:
    payload = body(messages=FEW_SHOT, max_tokens=48)
    choice, calls = calls_of(post(base_url, payload))
    assert calls == [("get_weather", '{"city": "Rome"}')]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    chunks, stream_calls = streamed(base_url, payload)
    assert [(n, json.loads(a)) for n, a in stream_calls] == [("get_weather", {"city": "Rome"})]
    assert not any(c["delta"].get("content") for c in chunks)
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_auto_answers_with_text_when_the_model_calls_nothing(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hello! Tell me a joke."}],
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=12,
    )
    message = reply.choices[0].message
    assert message.content and message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_conversation_with_a_call_and_its_result_is_answered(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            *FEW_SHOT[:2],
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 22 C"},
        ],  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        temperature=0,
        max_tokens=8,
    )
    assert reply.choices[0].message.content
    assert reply.choices[0].message.tool_calls is None
    assert reply.usage is not None and reply.usage.prompt_tokens > 200  # the tools are in it


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools.0.function.name",
        ),
        ({"tools": [ADD, ADD]}, "tools.1.function.name"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": {}},
                            }
                        ],
                    }
                ]
            },
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_bad_tools_and_tool_messages_are_400s_naming_the_parameter(
    base_url: str, fields: dict[str, Any], param: str
) -> None:
    payload = {k: v for k, v in body(**fields).items() if v is not None}
    response = post(base_url, payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
