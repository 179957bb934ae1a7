"""Structured outputs on the real engine (vLLM's xgrammar backend): every kind of constraint
is honoured on both endpoints and in streams, constraints xgrammar or JSON Schema refuse are
400s naming the parameter (and leave the engine serving), equal requests hit the cache, and
50 random object schemas always give JSON valid against them."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any

import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.support.gateway import MODEL_NAME
from tests.support.metrics import metric_value

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a person living in Europe as JSON."}]
BYPASS_CACHE = {"Cache-Control": "no-cache"}


def chat(base_url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": MODEL_NAME, "temperature": 0, **body},
        headers=headers if headers is not None else BYPASS_CACHE,
        timeout=120,
    )


def person_format(strict: bool | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "person", "schema": PERSON}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


@pytest.mark.parametrize("strict", [True, None])
def test_json_schema_gives_json_valid_against_it(client: OpenAI, strict: bool | None) -> None:
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK_PERSON,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=100,
        response_format=person_format(strict),  # type: ignore[arg-type]
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    # Compact whitespace: the grammar leaves no blanks between JSON tokens.
    assert ", " not in choice.message.content.replace('", "', "")


def test_json_object_ends_with_stop(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Give the capital of France as a JSON object."}],
        temperature=0,
        max_tokens=120,
        response_format={"type": "json_object"},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content or ""), dict)


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"regex": "[0-9]{3}-[0-9]{4}"}, lambda text: re.fullmatch(r"[0-9]{3}-[0-9]{4}", text)),
        ({"choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
        (
            {"grammar": 'root ::= "cat" | "dog" | "bird"'},
            lambda text: text in ("cat", "dog", "bird"),
        ),
    ],
)
def test_structured_outputs_extension_is_honoured(
    base_url: str, constraint: dict[str, Any], check: Any
) -> None:
    response = chat(
        base_url,
        {
            "messages": [{"role": "user", "content": "Answer with a phone number."}],
            "max_tokens": 20,
            "structured_outputs": constraint,
        },
    )
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["message"]["content"]
    assert check(text), text


def test_text_completions_take_a_json_schema(client: OpenAI) -> None:
    response = client.completions.create(
        model=MODEL_NAME,
        prompt="A person as JSON:",
        temperature=0,
        max_tokens=100,
        extra_body={"response_format": person_format(None)},
    )
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].text), PERSON)


async def test_a_streamed_json_schema_response_concatenates_to_valid_json(
    aclient: AsyncOpenAI,
) -> None:
    stream = await aclient.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK_PERSON,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=100,
        stream=True,
        response_format=person_format(True),  # type: ignore[arg-type]
    )
    parts: list[str] = []
    finish: list[str] = []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert len([p for p in parts if p]) > 1  # it did stream
    assert finish == ["stop"]
    jsonschema.validate(json.loads("".join(parts)), PERSON)


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


NASTY = [
    # xgrammar refuses these (vLLM's validation, run by the gateway before admission).
    ({"structured_outputs": {"regex": "a["}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "(?=a)b"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "x\u0000"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": 'root ::= "a" |'}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar"),
    (
        {"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}},
        "structured_outputs.json",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": {"$ref": "#/$defs/missing"}},
            }
        },
        "response_format.json_schema.schema",
    ),
    # JSON Schema refuses this one.
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": {"type": "string", "minLength": -1}},
            }
        },
        "response_format.json_schema.schema",
    ),
    # The gateway's own bounds.
    ({"structured_outputs": {"json": deep_schema(40)}}, "structured_outputs.json"),
    (
        {"structured_outputs": {"json": {"enum": [f"value-{i}" for i in range(20_000)]}}},
        "structured_outputs.json",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
]


def test_refused_constraints_are_400s_naming_the_parameter(base_url: str) -> None:
    for body, param in NASTY:
        response = chat(
            base_url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **body}
        )
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == param, (body, error)
        assert error["type"] == "invalid_request_error"
        assert "/project/" not in error["message"]  # no native source paths
    # The engine is alive and still constrains output.
    response = chat(
        base_url,
        {"messages": ASK_PERSON, "max_tokens": 5, "structured_outputs": {"choice": ["ok"]}},
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "ok"


def test_identical_json_schema_requests_hit_the_cache(base_url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "A person from Oslo, as JSON (cache test)."}],
        "max_tokens": 100,
        "response_format": person_format(True),
    }
    first, second = (chat(base_url, body, headers={}) for _ in range(2))
    assert [first.headers["x-cache"], second.headers["x-cache"]] == ["MISS", "HIT"]
    a, b = first.json(), second.json()
    for part in (a, b):
        part.pop("id"), part.pop("created")
    assert a == b
    jsonschema.validate(json.loads(a["choices"][0]["message"]["content"]), PERSON)
    # Another schema is another entry.
    other = {**body, "max_tokens": 16, "response_format": {"type": "json_object"}}
    assert chat(base_url, other, headers={}).headers["x-cache"] == "MISS"


def test_structured_requests_are_counted_by_kind(base_url: str) -> None:
    name = "sluicegate_structured_output_requests_total"
    before = metric_value(base_url, name)
    response = chat(
        base_url,
        {"messages": ASK_PERSON, "max_tokens": 3, "structured_outputs": {"choice": ["a", "b"]}},
    )
    assert response.status_code == 200
    assert metric_value(base_url, name) == before + 1
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    assert re.search(r'sluicegate_structured_output_requests_total\{kind="choice"\} [1-9]', text)


# ---- random schemas ------------------------------------------------------------------------


# A 135M model asked for free text or numbers may never stop (a string of "1111...", digits
# without end): the fields are bounded, as a schema for a small model would be.
INTEGER = {"type": "integer", "minimum": 0, "maximum": 100}
STRING = {"type": "string", "maxLength": 12}


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema of 1-4 fields: string, integer, number, boolean, enum, array or (once
    nested) object, each bounded, a random subset required."""
    kinds = ["string", "integer", "number", "boolean", "enum", "array"]
    if depth < 1:
        kinds.append("object")
    properties: dict[str, Any] = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(kinds)
        name = f"{rng.choice(['id', 'name', 'size', 'flag', 'kind', 'items', 'info'])}_{i}"
        if kind == "enum":
            field: dict[str, Any] = {"enum": rng.sample(["red", "green", "blue", "cyan"], 2)}
        elif kind == "array":
            item = rng.choice([INTEGER, {"type": "boolean"}, STRING])
            field = {"type": "array", "items": item, "maxItems": 3}
        elif kind == "object":
            field = random_schema(rng, depth + 1)
        elif kind == "string":
            field = {"type": "string", "maxLength": rng.choice([8, 16, 24])}
        elif kind == "integer":
            field = {"type": "integer", "minimum": -rng.choice([0, 10, 1000]), "maximum": 10**6}
        elif kind == "number":
            field = {"type": "number", "minimum": 0, "maximum": rng.choice([1, 100, 10**4])}
        else:
            field = {"type": kind}
        properties[name] = field
    required = rng.sample(sorted(properties), rng.randint(0, len(properties)))
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


async def test_fifty_random_schemas_always_give_valid_json(base_url: str) -> None:
    rng = random.Random(17)
    schemas = [random_schema(rng) for _ in range(50)]
    limit = asyncio.Semaphore(16)

    async with httpx.AsyncClient(base_url=base_url, timeout=300, headers=BYPASS_CACHE) as http:

        async def one(index: int, schema: dict[str, Any]) -> tuple[str, str]:
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"Fill in record number {index}."}],
                "temperature": 0,
                "max_tokens": 300,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": f"record_{index}", "schema": schema, "strict": True},
                },
            }
            async with limit:
                response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            return choice["message"]["content"], choice["finish_reason"]

        results = await asyncio.gather(*(one(i, s) for i, s in enumerate(schemas)))
    for schema, (text, finish) in zip(schemas, results, strict=True):
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
