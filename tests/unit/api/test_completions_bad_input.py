"""Bad input found in review of the issue-17 surface: each a 400 (or cleanly dropped), never
a 500. The app over the fake engine, through FastAPI's test client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.support.fakes import FAKE_MODEL, fake_app

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(fake_app()) as test_client:
        yield test_client


def tool(parameters: object) -> dict[str, object]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [tool({"type": "object", "$schema": [1]})]}, "tools.0.function.parameters"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "$schema": {}}},
                }
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_schema_whose_dollar_schema_is_not_a_string_is_a_400(
    client: TestClient, extra: dict[str, object], param: str
) -> None:
    response = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_forced_tool_schema_is_held_to_the_schema_bounds(client: TestClient) -> None:
    deep: dict[str, object] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    body = {**CHAT, "tools": [tool(deep)], "tool_choice": "required"}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools"


def test_a_tool_schema_refused_once_is_refused_again_from_memory(client: TestClient) -> None:
    body = {**CHAT, "tools": [tool({"type": "object", "properties": 3})]}
    first = client.post("/v1/chat/completions", json=body)
    second = client.post("/v1/chat/completions", json=body)
    assert first.status_code == second.status_code == 400
    assert first.json() == second.json()


def test_a_stored_input_item_keeps_only_known_fields_and_gets_its_own_id(
    client: TestClient,
) -> None:
    item = {"type": "message", "role": "user", "content": "hi", "extra": "\ud800", "id": 7}
    body = json.dumps({"model": FAKE_MODEL, "input": [item], "max_output_tokens": 3})
    created = client.post(
        "/v1/responses", content=body, headers={"content-type": "application/json"}
    )
    assert created.status_code == 200, created.text
    items = client.get(f"/v1/responses/{created.json()['id']}/input_items").json()["data"]
    assert len(items) == 1
    assert "extra" not in items[0]
    assert isinstance(items[0]["id"], str) and items[0]["id"] != 7
    assert items[0]["content"] == [{"type": "input_text", "text": "hi"}]


def test_tools_on_tokenize_are_refused_rather_than_left_out_of_the_count(
    client: TestClient,
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool(None)]}
    response = client.post("/tokenize", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools"
