from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from sluicegate.errors import InvalidRequestError
from sluicegate.http.errors import validation_param
from sluicegate.wire.requests import ChatCompletionRequest
from sluicegate.wire.tools import ToolLimits

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def setup(limits: ToolLimits | None = None, **fields: Any) -> Any:
    """The request's tools, resolved and their schemas checked (the service checks them in a
    worker thread)."""
    request = ChatCompletionRequest.model_validate({**BASE, **fields})
    tools = request.tool_setup(limits or ToolLimits())
    tools.check_schemas()
    return tools


def refused(**fields: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        setup(**fields)
    return caught.value


def test_tools_default_to_auto_and_keep_openai_shape() -> None:
    tools = setup(tools=[WEATHER, TIME])
    assert tools.mode == "auto" and tools.names == ("get_weather", "get_time")
    assert tools.tools[0] == WEATHER
    assert tools.forced_schema() is None


def test_no_tools_is_no_tool_mode() -> None:
    assert setup().mode == "none" and setup().tools == ()


def test_legacy_functions_mean_tools() -> None:
    legacy = setup(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    modern = setup(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert legacy.legacy and not modern.legacy
    assert (legacy.tools, legacy.mode, legacy.function) == (modern.tools, "named", "get_weather")
    assert setup(functions=[WEATHER["function"]], function_call="none").mode == "none"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"function_call": "auto"}, "function_call"),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        ({"functions": [TIME["function"], TIME["function"]]}, "functions.1.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "functions": [TIME["function"]]}, "functions"),
        ({"tools": [WEATHER], "tool_choice": "auto", "function_call": "auto"}, "function_call"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": 3},
                        },
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
            "tools",
        ),
    ],
)
def test_tool_fields_that_disagree_are_400s_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    assert refused(**fields).param == param


def test_too_many_or_too_large_tools_are_refused() -> None:
    many = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(5)]
    with pytest.raises(InvalidRequestError) as caught:
        setup(ToolLimits(max_tools=4), tools=many)
    assert caught.value.param == "tools"
    with pytest.raises(InvalidRequestError) as caught:
        setup(ToolLimits(max_bytes=100), tools=[WEATHER])
    assert caught.value.param == "tools"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools.0.function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools.0.function.parameters",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
    ],
)
def test_malformed_tools_are_refused_at_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({**BASE, **fields})
    assert validation_param(("body", *caught.value.errors()[0]["loc"])).startswith(param)


def test_named_schema_is_the_functions_parameters() -> None:
    tools = setup(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert tools.mode == "named" and tools.function == "get_time"
    assert json.loads(tools.forced_schema() or "") == {"type": "object", "properties": {}}
    weather = setup(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert json.loads(weather.forced_schema() or "") == WEATHER["function"]["parameters"]


def test_required_schema_accepts_calls_of_any_tool_and_nothing_else() -> None:
    schema = json.loads(setup(tools=[WEATHER, TIME], tool_choice="required").forced_schema() or "")
    valid = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_time", "arguments": {}},
    ]
    jsonschema.validate(valid, schema)
    for bad in (
        [],
        [{"name": "get_weather", "arguments": {"days": 2}}],
        [{"name": "other", "arguments": {}}],
        [{"name": "get_weather", "arguments": {"city": "Paris"}, "extra": 1}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_parallel_tool_calls_false_allows_one_call() -> None:
    schema = json.loads(
        setup(tools=[TIME], tool_choice="required", parallel_tool_calls=False).forced_schema() or ""
    )
    call = {"name": "get_time", "arguments": {}}
    jsonschema.validate([call], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([call, call], schema)


def test_required_schema_hoists_definitions_to_the_root() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "place",
            "parameters": {
                "type": "object",
                "$defs": {"city": {"type": "string", "minLength": 2}},
                "properties": {"city": {"$ref": "#/$defs/city"}},
                "required": ["city"],
            },
        },
    }
    schema = json.loads(setup(tools=[tool], tool_choice="required").forced_schema() or "")
    assert "city" in schema["$defs"]
    jsonschema.validate([{"name": "place", "arguments": {"city": "Rome"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "place", "arguments": {"city": "R"}}], schema)
