"""Real clients against a real gateway: each call of issue 17's acceptance, as the client makes it.

langchain-openai's structured output and tool binding, the `openai` SDK's `parse`, JSON mode,
tool conversations, `logit_bias`, the Responses API and tool-call streaming, vLLM's
`/tokenize` and `/detokenize`, and lm-eval-harness's loglikelihood request (echo + logprobs).
The JS SDK is in test_js_client.py. Set GATEWAY_TEST_BASE_URL to run these against another
server (docs/testing.md).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field

from tests.integration.conftest import BYPASS_CACHE

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40, "description": "The city's name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
WEATHER_QUESTION = "What is the weather like in Paris today?"
AUTO_TOOL_PROMPT = (
    "Reply with exactly this and nothing else: "
    '<tool_call>{"name": "GetWeather", "arguments": {"city": "Paris"}}</tool_call>'
)


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: int = Field(ge=0, le=100)


class Pet(BaseModel):
    name: str
    age: int


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=40, description="The city's name, e.g. Paris")


class GetTime(BaseModel):
    """Get the current time in a timezone."""

    timezone: str = Field(max_length=32, description="An IANA timezone, e.g. Europe/Paris")


@pytest.fixture(scope="module")
def chat_model(base_url: str, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=f"{base_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_tokens=80,  # type: ignore[call-arg]
        max_retries=0,
        timeout=120,
        default_headers=BYPASS_CACHE,
    )


def validate_tool_arguments(arguments: object, schema: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(arguments, dict), arguments
    jsonschema.validate(arguments, schema)
    return arguments


# langchain-openai


def test_langchain_structured_output_json_schema(chat_model: ChatOpenAI) -> None:
    structured = chat_model.with_structured_output(City, method="json_schema")
    city = structured.invoke("Give the capital of France, its country and its population.")
    assert isinstance(city, City)
    assert isinstance(city.name, str) and city.name
    assert isinstance(city.country, str) and city.country
    assert isinstance(city.population_millions, int)


def test_langchain_structured_output_json_mode(chat_model: ChatOpenAI) -> None:
    structured = chat_model.with_structured_output(Pet, method="json_mode")
    # JSON mode guarantees a JSON object, not its keys: the prompt names them, and the answer
    # must parse into the model class.
    pet = structured.invoke(
        'A cat named Tom is 4 years old. Give his "name" and "age" as a JSON object.'
    )
    assert isinstance(pet, Pet)
    assert (pet.name, pet.age) == ("Tom", 4)


def tool_schemas() -> dict[str, dict[str, Any]]:
    return {"GetWeather": GetWeather.model_json_schema(), "GetTime": GetTime.model_json_schema()}


@pytest.mark.parametrize(("tool_choice", "expected"), [("GetTime", "GetTime"), ("any", None)])
def test_langchain_bind_tools_forced(
    chat_model: ChatOpenAI, tool_choice: str, expected: str | None
) -> None:
    # Named: the question is about the weather, yet the named tool is the one called.
    bound = chat_model.bind_tools([GetWeather, GetTime], tool_choice=tool_choice)
    reply = bound.invoke(WEATHER_QUESTION)
    assert isinstance(reply, AIMessage)
    assert len(reply.tool_calls) >= 1
    assert reply.invalid_tool_calls == []
    for call in reply.tool_calls:
        assert call["name"] in tool_schemas()
        if expected is not None:
            assert call["name"] == expected
        validate_tool_arguments(call["args"], tool_schemas()[call["name"]])
        assert call["id"]


def test_langchain_bind_tools_auto_calls_the_tool(chat_model: ChatOpenAI) -> None:
    # SmolLM2-135M calls no tool unprompted (a weather question gets a made-up forecast), but
    # it repeats what it is told to: the call arrives in the template's text form, which the
    # gateway's tool parser must turn into `tool_calls`.
    bound = chat_model.bind_tools([GetWeather])
    reply = bound.invoke(AUTO_TOOL_PROMPT)
    assert isinstance(reply, AIMessage)
    assert [call["name"] for call in reply.tool_calls] == ["GetWeather"], reply
    assert reply.invalid_tool_calls == []
    args = validate_tool_arguments(reply.tool_calls[0]["args"], GetWeather.model_json_schema())
    assert "paris" in args["city"].lower()


def test_langchain_bind_tools_auto_text_answer(chat_model: ChatOpenAI) -> None:
    bound = chat_model.bind_tools([GetWeather])
    reply = bound.invoke("Say hello to me in French.")
    assert isinstance(reply, AIMessage)
    assert reply.tool_calls == []
    assert reply.invalid_tool_calls == []
    assert isinstance(reply.content, str) and reply.content.strip()
    assert "<tool_call>" not in reply.content


# The openai SDK


def test_sdk_parse_pydantic(client: OpenAI, model: str) -> None:
    completion = client.chat.completions.parse(
        model=model,
        messages=[
            {"role": "user", "content": "Give the capital of Italy, its country and population."}
        ],
        response_format=City,
        temperature=0,
        max_tokens=80,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert message.refusal is None
    assert isinstance(message.parsed, City)
    assert message.parsed == City.model_validate_json(message.content or "")
    assert isinstance(message.parsed.population_millions, int)


def test_sdk_json_object(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a dog as JSON with a name and an age."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=80,
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_sdk_conversation_with_tool_calls_and_tool_result(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": WEATHER_QUESTION},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_weather_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_weather_1",
                "content": '{"temperature_celsius": 21, "sky": "sunny"}',
            },
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        temperature=0,
        max_tokens=40,
    )
    message = reply.choices[0].message
    assert message.role == "assistant"
    assert not message.tool_calls
    assert isinstance(message.content, str)
    # The tool's result reached the model: SmolLM2 (greedy) repeats it.
    assert "sunny" in message.content or "21" in message.content, message.content


def test_sdk_logit_bias(client: OpenAI, model: str, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=4, logprobs=True
    )
    assert plain.choices[0].logprobs and plain.choices[0].logprobs.content
    first = plain.choices[0].logprobs.content[0].token
    first_id = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(first))[0]
    (forced_id,) = tokenizer.encode(" banana", add_special_tokens=False)
    banned = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=4,
        logprobs=True,
        logit_bias={str(first_id): -100},
    )
    assert banned.choices[0].logprobs and banned.choices[0].logprobs.content
    assert banned.choices[0].logprobs.content[0].token != first
    forced = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=3,
        logit_bias={str(forced_id): 100},
    )
    assert forced.choices[0].message.content == " banana" * 3


def test_sdk_responses_create(client: OpenAI, model: str) -> None:
    response = client.responses.create(
        model=model,
        input="What is the capital of France?",
        temperature=0,
        max_output_tokens=24,
    )
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message"
    assert "Paris" in response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0


def test_sdk_responses_stream(client: OpenAI, model: str) -> None:
    deltas: list[str] = []
    event_types: list[str] = []
    with client.responses.stream(
        model=model,
        # Short enough to finish: the SDK's helper needs `response.completed` (OpenAI ends a
        # response cut by max_output_tokens with `response.incomplete` instead).
        input="Name three colours of the rainbow, separated by commas.",
        temperature=0,
        max_output_tokens=64,
    ) as stream:
        for event in stream:
            event_types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert event_types[0] == "response.created"
    assert event_types[-1] == "response.completed"
    assert len(deltas) > 1, "the text arrives in several deltas"
    assert "".join(deltas) == final.output_text
    assert final.output_text.strip()


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_sdk_tool_call_stream(client: OpenAI, model: str, tool_choice: Any) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": WEATHER_QUESTION}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    # Reassembled as the SDK's docs show: deltas keyed by index, arguments concatenated.
    calls: dict[int, dict[str, str]] = {}
    chunks = 0
    tool_chunks = 0
    finish_reason = None
    for chunk in stream:
        chunks += 1
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish_reason = choice.finish_reason or finish_reason
        for delta in choice.delta.tool_calls or []:
            tool_chunks += 1
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    assert chunks > 2, "the stream came in several chunks"
    assert tool_chunks >= 1
    assert calls, "no tool call streamed"
    assert finish_reason in ("tool_calls", "stop")
    for call in calls.values():
        assert call["id"]
        assert call["name"] == "get_weather"
        validate_tool_arguments(json.loads(call["arguments"]), WEATHER_PARAMETERS)


# vLLM's /tokenize and /detokenize


def test_tokenize_and_detokenize(base_url: str, model: str, tokenizer: Any) -> None:
    text = "Hello world, this is sluicegate."
    with httpx.Client(base_url=base_url, timeout=30) as http:
        tokenized = http.post("/tokenize", json={"model": model, "prompt": text})
        assert tokenized.status_code == 200, tokenized.text
        body = tokenized.json()
        assert body["tokens"] == tokenizer(text)["input_ids"]
        assert body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 2048
        detokenized = http.post("/detokenize", json={"model": model, "tokens": body["tokens"]})
        assert detokenized.status_code == 200, detokenized.text
        assert detokenized.json()["prompt"] == text


# lm-eval-harness's loglikelihood: the payload of its `local-completions` model (token ids in,
# echo, one generated token that is dropped), parsed as its `parse_logprobs` does.

CONTEXT = "The capital of France is"
CONTINUATIONS = (" Paris", " a banana")


def lm_eval_payload(model: str, prompts: list[list[int]]) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }


def loglikelihood(choice: dict[str, Any], context_length: int) -> tuple[float, bool]:
    token_logprobs = choice["logprobs"]["token_logprobs"][context_length:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][context_length:-1]
    is_greedy = all(
        logprob == max(top.values())
        for logprob, top in zip(token_logprobs, top_logprobs, strict=True)
    )
    return sum(token_logprobs), is_greedy


def test_lm_eval_loglikelihood(base_url: str, model: str, tokenizer: Any) -> None:
    context = tokenizer.encode(CONTEXT, add_special_tokens=False)
    continuations = [tokenizer.encode(c, add_special_tokens=False) for c in CONTINUATIONS]
    prompts = [context + continuation for continuation in continuations]
    reply = httpx.post(
        f"{base_url}/v1/completions",
        json=lm_eval_payload(model, prompts),
        headers={"Authorization": "Bearer unused", **BYPASS_CACHE},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    choices = sorted(reply.json()["choices"], key=lambda choice: choice["index"])
    assert len(choices) == len(prompts)
    scores = []
    for choice, prompt in zip(choices, prompts, strict=True):
        logprobs = choice["logprobs"]
        # The echoed prompt, then the one generated token.
        length = len(prompt) + 1
        assert len(logprobs["tokens"]) == length
        assert len(logprobs["token_logprobs"]) == length
        assert len(logprobs["top_logprobs"]) == length
        assert len(logprobs["text_offset"]) == length
        assert logprobs["token_logprobs"][0] is None  # nothing precedes the first token
        assert logprobs["top_logprobs"][0] is None
        assert choice["text"].startswith(tokenizer.decode(prompt))
        for token, logprob, top in zip(
            logprobs["tokens"][1:],
            logprobs["token_logprobs"][1:],
            logprobs["top_logprobs"][1:],
            strict=True,
        ):
            assert logprob <= 0.0
            assert 1 <= len(top) <= 2  # the most likely token, and the prompt's own if other
            assert top[token] == logprob
        scores.append(loglikelihood(choice, len(context)))
    (paris, paris_greedy), (banana, banana_greedy) = scores
    assert paris > banana
    assert paris_greedy is True
    assert banana_greedy is False


def test_completions_echo_logprobs_zero(client: OpenAI, model: str) -> None:
    reply = client.completions.create(
        model=model, prompt=CONTEXT + " Paris", echo=True, logprobs=0, max_tokens=1
    )
    choice = reply.choices[0]
    assert choice.text.startswith(CONTEXT + " Paris")
    assert choice.logprobs is not None
    tokens = choice.logprobs.tokens or []
    token_logprobs = choice.logprobs.token_logprobs or []
    top_logprobs = choice.logprobs.top_logprobs or []
    assert len(tokens) == len(token_logprobs) == len(top_logprobs) >= 6
    assert token_logprobs[0] is None
    assert all(logprob <= 0.0 for logprob in token_logprobs[1:])
    # logprobs=0: only the chosen token's own logprob in each entry.
    assert all(
        list(top) == [token] for token, top in zip(tokens[1:], top_logprobs[1:], strict=True)
    )
