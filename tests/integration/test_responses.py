"""The Responses API on the real engine through the official `openai` SDK: bodies, streams,
the (in-process) store, `previous_response_id`, refusals and `text.format`. The Redis store
shared by two gateway processes, and kept apart per key, is in `test_redis_resilience.py`."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.gateway import MODEL_NAME

SHORT = 16


def test_create_store_get_delete_through_the_sdk(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_NAME,
        input="Name a colour.",
        instructions="Answer in one word.",
        max_output_tokens=SHORT,
        temperature=0,
        metadata={"case": "create"},
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text.strip()
    assert response.status in ("completed", "incomplete")
    assert (response.status == "incomplete") == (response.incomplete_details is not None)
    usage = response.usage
    assert usage is not None and 0 < usage.output_tokens <= SHORT
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Answer in one word." and response.max_output_tokens == SHORT
    assert response.metadata == {"case": "create"} and response.to_dict()["store"] is True

    stored = client.responses.retrieve(response.id)
    assert stored.model_dump() == response.model_dump()
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_stream_events_in_order_and_deltas_make_the_output(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_NAME, input="Count to five.", max_output_tokens=SHORT, temperature=0
    ) as stream:
        events = list(stream)
    types = [e.type for e in events]
    final = events[-1].response  # type: ignore[union-attr]
    ending = "response.completed" if final.status == "completed" else "response.incomplete"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        ending,
    ]
    assert deltas and "".join(e.delta for e in deltas) == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL_NAME, input="My name is Ada.", max_output_tokens=SHORT, temperature=0
    )
    second = client.responses.create(
        model=MODEL_NAME,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=SHORT,
        temperature=0,
    )
    assert first.usage is not None and second.usage is not None
    # The second prompt holds the first input and output, then the new question.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_NAME, input="x", previous_response_id="resp_absent")
    assert caught.value.code == "previous_response_not_found"


def test_built_in_tools_are_refused_by_name(base_url: str) -> None:
    body = {"model": MODEL_NAME, "input": "x", "tools": [{"type": "web_search"}]}
    response = httpx.post(f"{base_url}/v1/responses", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"


def test_json_schema_text_format_constrains_the_output(client: openai.OpenAI) -> None:
    """Passes once structured outputs (branch i17-so) accept the chat `response_format`
    this converts `text.format` to; until then the chat request refuses it (400)."""
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL_NAME,
        input="Pick a colour.",
        max_output_tokens=32,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text)["colour"] in ("red", "green", "blue")
    assert response.text.format.type == "json_schema"  # type: ignore[union-attr]


def test_a_named_function_answers_with_a_function_call_that_continues(
    client: openai.OpenAI,
) -> None:
    """Passes once tool calling (branch i17-tools) accepts the chat `tools` this converts
    function tools to; until then the chat request refuses them (400)."""
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    response = client.responses.create(
        model=MODEL_NAME,
        input="What is the weather in Paris?",
        tools=[weather],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    follow = client.responses.create(
        model=MODEL_NAME,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}],
        max_output_tokens=SHORT,
        temperature=0,
    )
    assert follow.output_text.strip()


def test_a_function_call_output_is_stored_with_its_known_fields_only(base_url: str) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": [{"text": "Sunny"}]}
    question = {"role": "user", "content": "What is the weather?"}
    body = {"model": MODEL_NAME, "max_output_tokens": SHORT, "temperature": 0}

    def post(*items: dict[str, object]) -> httpx.Response:
        json_body = {**body, "input": list(items)}
        return httpx.post(f"{base_url}/v1/responses", json=json_body, timeout=60)

    for extra in ({**output, "note": "kept?"}, {**output, "output": [{"text": "x", "n": 1}]}):
        refused = post(question, call, extra)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "input"
        assert "input[2]." in error["message"] and "is not a field of" in error["message"]

    answered = post(question, call, {**output, "id": "fco_0", "status": "completed"})
    assert answered.status_code == 200, answered.text
    listed = httpx.get(
        f"{base_url}/v1/responses/{answered.json()['id']}/input_items",
        params={"order": "asc"},
        timeout=30,
    ).json()["data"]
    stored = listed[2]
    assert stored["id"].startswith("fco_") and stored["id"] != "fco_0"
    assert {k: v for k, v in stored.items() if k != "id"} == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_text", "text": "Sunny"}],
    }
