"""Structured outputs in the inference layer (`inference.structured`): which constraint a
request asks for, its bounds and canonical form, and the memoized check; then, over the app
with the fake engine (FakeEngine stands in for vLLM's grammar check), the 400s and the
engine options a request gets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.engine.protocol import StructuredOutput
from sluicegate.errors import InvalidRequestError
from sluicegate.inference.structured import (
    ConstraintCheck,
    Requested,
    StructuredLimits,
    requested_constraint,
)
from sluicegate.wire.json_schema import schema_problem
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app
from tests.support.metrics import local_value

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
LIMITS = StructuredLimits()
SCHEMA = {
    "type": "object",
    "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
    "required": ["a", "b"],
}


def chat(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**CHAT, **extra})


def json_schema(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


def refusal(request: ChatCompletionRequest, limits: StructuredLimits = LIMITS) -> str | None:
    with pytest.raises(InvalidRequestError) as caught:
        requested_constraint(request, limits)
    return caught.value.param


# ---- which constraint ------------------------------------------------------------------------


def test_no_constraint_without_the_fields_or_with_text() -> None:
    assert requested_constraint(chat(), LIMITS) is None
    assert requested_constraint(chat(response_format={"type": "text"}), LIMITS) is None


@pytest.mark.parametrize("strict", [None, True, False])
def test_json_schema_becomes_canonical_text(strict: bool | None) -> None:
    extra = {} if strict is None else {"strict": strict}
    requested = requested_constraint(chat(response_format=json_schema(SCHEMA, **extra)), LIMITS)
    assert requested is not None
    assert requested.kind == "json_schema"
    assert requested.param == "response_format.json_schema.schema"
    # Keys sorted, but the properties keep their order (b, then a): the output follows it.
    assert requested.output.json == (
        '{"properties":{"b":{"type":"integer"},"a":{"type":"string"}},'
        '"required":["a","b"],"type":"object"}'
    )
    assert requested.output.compact_whitespace is True


def test_equal_schemas_in_any_key_order_or_field_give_equal_constraints() -> None:
    reordered = {"required": ["a", "b"], "type": "object", "properties": {
                 "b": {"type": "integer"}, "a": {"type": "string"}}}  # fmt: skip
    a = requested_constraint(chat(response_format=json_schema(SCHEMA)), LIMITS)
    b = requested_constraint(chat(response_format=json_schema(reordered)), LIMITS)
    c = requested_constraint(chat(structured_outputs={"json": json.dumps(reordered)}), LIMITS)
    d = requested_constraint(chat(structured_outputs={"json": SCHEMA}), LIMITS)
    assert a is not None and b is not None and c is not None and d is not None
    assert a.output == b.output == c.output == d.output
    assert c.param == "structured_outputs.json"


def test_the_order_of_properties_is_part_of_the_constraint() -> None:
    swapped = {**SCHEMA, "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    a = requested_constraint(chat(response_format=json_schema(SCHEMA)), LIMITS)
    b = requested_constraint(chat(response_format=json_schema(swapped)), LIMITS)
    assert a is not None and b is not None and a.output != b.output


def test_nested_properties_keep_their_order_and_a_property_may_be_named_properties() -> None:
    inner = {"y": {"type": "string"}, "properties": {"type": "integer", "minimum": 0}}
    schema = {
        "type": "object",
        "properties": {"z": {"type": "object", "properties": inner}, "a": {}},
    }
    requested = requested_constraint(chat(structured_outputs={"json": schema}), LIMITS)
    assert requested is not None
    assert requested.output.json == (
        '{"properties":{"z":{"properties":{"y":{"type":"string"},'
        '"properties":{"minimum":0,"type":"integer"}},"type":"object"},"a":{}},"type":"object"}'
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
        ({"structured_outputs": {"json_object": True}}, StructuredOutput(json_object=True)),
        ({"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutput(regex="[0-9]+")),
        ({"structured_outputs": {"choice": ["y", "n"]}}, StructuredOutput(choice=("y", "n"))),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            StructuredOutput(grammar='root ::= "a"'),
        ),
        # OpenAI's schema is optional: without one, any JSON object.
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            StructuredOutput(json_object=True),
        ),
    ],
)
def test_each_kind_maps_to_its_constraint(extra: dict[str, Any], expected: object) -> None:
    requested = requested_constraint(chat(**extra), LIMITS)
    assert requested is not None and requested.output == expected


def test_completions_take_both_fields_too() -> None:
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}
    )
    requested = requested_constraint(request, LIMITS)
    assert requested is not None and requested.kind == "json_object"


def test_compact_whitespace_follows_the_setting() -> None:
    loose = StructuredLimits(compact_whitespace=False)
    requested = requested_constraint(chat(response_format={"type": "json_object"}), loose)
    assert requested is not None and requested.output.compact_whitespace is False


# ---- refusals ------------------------------------------------------------------------------


def test_both_fields_at_once_are_refused() -> None:
    request = chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a"})
    assert refusal(request) == "structured_outputs"


def test_disable_any_whitespace_must_match_the_server() -> None:
    assert requested_constraint(
        chat(structured_outputs={"regex": "a", "disable_any_whitespace": True}), LIMITS
    )
    request = chat(structured_outputs={"regex": "a", "disable_any_whitespace": False})
    assert refusal(request) == "structured_outputs.disable_any_whitespace"


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": json_schema(nested(20))}, "response_format.json_schema.schema"),
        ({"structured_outputs": {"json": nested(20)}}, "structured_outputs.json"),
        (
            {"response_format": json_schema({"enum": [f"v{i}" for i in range(5000)]})},
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"json": "x" * 40_000}}, "structured_outputs.json"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"json": "[1, 2]"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a" * 4097}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "x" * 40_000}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"grammar": "  "}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": ["a"] * 257}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": ["a" * 1025]}}, "structured_outputs.choice"),
    ],
)
def test_oversized_or_malformed_constraints_name_their_parameter(
    extra: dict[str, Any], param: str
) -> None:
    assert refusal(chat(**extra)) == param


def test_depth_and_size_limits_are_settings() -> None:
    small = StructuredLimits(max_schema_depth=4, max_schema_bytes=64)
    assert requested_constraint(chat(response_format=json_schema(nested(1))), small)
    assert refusal(chat(response_format=json_schema(nested(2))), small) is not None
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5)}}
    assert refusal(chat(response_format=json_schema(wide)), small) is not None


def test_the_size_walk_stops_at_the_limit() -> None:
    # A schema of millions of nodes is refused after a walk of about the limit's size.
    huge = {"enum": list(range(2_000_000))}
    with pytest.raises(InvalidRequestError, match="at most 32768 bytes"):
        requested_constraint(chat(structured_outputs={"json": huge}), LIMITS)


# ---- JSON Schema and the memoized check ----------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [{"type": "foo"}, {"type": "object", "required": "a"}, {"properties": {"a": {"minimum": "x"}}}],
)
def test_invalid_json_schemas_are_named(schema: dict[str, Any]) -> None:
    assert schema_problem(schema).startswith("The schema is not a valid JSON Schema")


def test_valid_json_schemas_pass() -> None:
    assert schema_problem(SCHEMA) == ""
    assert schema_problem({"$schema": "http://json-schema.org/draft-07/schema#", **SCHEMA}) == ""


async def test_the_check_remembers_verdicts_and_names_the_param() -> None:
    calls: list[StructuredOutput] = []

    async def engine_check(output: StructuredOutput) -> None:
        calls.append(output)
        if output.regex == "bad":
            raise InvalidRequestError("xgrammar says no")

    check = ConstraintCheck(engine_check)
    good = Requested(StructuredOutput(regex="ok"), "regex", "structured_outputs.regex")
    bad = Requested(StructuredOutput(regex="bad"), "regex", "structured_outputs.regex")
    assert await check.check(good) >= 0
    assert await check.check(good) == 0  # remembered: the engine is not asked again
    for _ in range(2):
        with pytest.raises(InvalidRequestError) as caught:
            await check.check(bad)
        assert (caught.value.message, caught.value.param) == (
            "xgrammar says no",
            "structured_outputs.regex",
        )
    assert calls == [good.output, bad.output]


async def test_a_schema_that_is_no_json_schema_never_reaches_the_engine() -> None:
    calls: list[StructuredOutput] = []

    async def engine_check(output: StructuredOutput) -> None:
        calls.append(output)

    requested = requested_constraint(chat(response_format=json_schema({"type": 3})), LIMITS)
    assert requested is not None
    with pytest.raises(InvalidRequestError) as caught:
        await ConstraintCheck(engine_check).check(requested)
    assert caught.value.param == "response_format.json_schema.schema"
    assert calls == []


# ---- over the app --------------------------------------------------------------------------


def post(client: TestClient, path: str = "/v1/chat/completions", **body: Any) -> Any:
    payload = {**CHAT, **body} if "chat" in path else {"model": FAKE_MODEL, **body}
    return client.post(path, json=payload)


def test_the_engine_gets_the_constraint_and_requests_are_counted() -> None:
    engine = FakeEngine()
    counter = "sluicegate_structured_output_requests_total"
    before = local_value(counter, kind="choice")
    with TestClient(fake_app(engine)) as client:
        response = post(client, structured_outputs={"choice": ["a", "b"]})
        assert response.status_code == 200, response.json()
        response = post(client, "/v1/completions", prompt="x", response_format={"type": "text"})
        assert response.status_code == 200, response.json()
    assert engine.requests[0][2].structured == StructuredOutput(choice=("a", "b"))
    assert engine.requests[1][2].structured is None
    assert local_value(counter, kind="choice") == before + 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": json_schema({"type": "foo"})}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
            "response_format.json_schema.name",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "refused("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "refused"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
        ),
    ],
)
def test_refused_constraints_are_400s_before_the_engine_runs(
    body: dict[str, Any], param: str
) -> None:
    engine = FakeEngine(refused_constraint="refused")
    with TestClient(fake_app(engine)) as client:
        response = post(client, **body)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == param
    assert engine.requests == []


def test_limits_come_from_settings() -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine, max_regex_length=3)) as client:
        assert post(client, structured_outputs={"regex": "abc"}).status_code == 200
        response = post(client, structured_outputs={"regex": "abcd"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "structured_outputs.regex"
