"""`api.route.LargeBodyRoute`: large bodies are parsed in the worker process, with the same
answers as bodies FastAPI parses itself; small ones of the inference routes are validated
from their bytes and handed to the endpoint, with FastAPI's handler for those that fail
(fake engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import fastapi.routing
import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from sluicegate.api import completions, embeddings, messages, responses, tokenize
from sluicegate.api.route import LARGE_BODY_BYTES, LargeBodyRoute
from sluicegate.wire.embeddings import EmbeddingRequest
from sluicegate.wire.messages import MessagesRequest
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app

JSON = {"content-type": "application/json"}


def post(http: TestClient, body: bytes) -> httpx.Response:
    return http.post("/v1/chat/completions", headers=JSON, content=body)


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, FakeEngine]]:
    engine = FakeEngine(max_model_len=1_000_000)
    with TestClient(fake_app(engine, max_request_bytes=16 * 1024 * 1024)) as test_client:
        yield test_client, engine


def many_parts(count: int, **extra: object) -> bytes:
    parts = [{"type": "text", "text": "word"}] * count
    body = {"model": FAKE_MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": parts}]}
    return json.dumps({**body, **extra}).encode()


def test_a_large_body_of_many_parts_is_parsed_and_joined_as_a_small_one_would_be(
    client: tuple[TestClient, FakeEngine],
) -> None:
    http, engine = client
    body = many_parts(20_000)
    assert len(body) > LARGE_BODY_BYTES
    response = post(http, body)
    assert response.status_code == 200, response.text
    # The fake tokenizer gives one id per word: the parts arrived joined, all of them.
    assert len(engine.requests[-1][1]) == 20_000 + 1  # and the role


def test_a_large_invalid_body_gets_the_same_400_as_a_small_one(
    client: tuple[TestClient, FakeEngine],
) -> None:
    http, _ = client
    small = post(http, many_parts(2, temperature=7))
    large = http.post(
        "/v1/chat/completions", headers=JSON, content=many_parts(20_000, temperature=7)
    )
    assert small.status_code == large.status_code == 400
    assert small.json() == large.json()
    assert large.json()["error"]["param"] == "temperature"


def test_a_large_body_that_is_not_json_is_a_400(client: tuple[TestClient, FakeEngine]) -> None:
    http, _ = client
    response = http.post(
        "/v1/chat/completions", headers=JSON, content=b"{" + b" " * LARGE_BODY_BYTES
    )
    assert response.status_code == 400
    assert "could not parse the JSON body" in response.json()["error"]["message"]


def test_the_event_loop_lag_is_measured(client: tuple[TestClient, FakeEngine]) -> None:
    http, _ = client
    text = http.get("/metrics").text
    assert "sluicegate_event_loop_lag_seconds_bucket" in text


# ---- small bodies: validated from their bytes ----------------------------------------------


def _direct(router: fastapi.routing.APIRouter) -> dict[str, bool]:
    found = {}
    for route in router.routes:
        assert isinstance(route, LargeBodyRoute)
        model = route._body_model()
        found[route.path] = model is not None and route._direct_call(model) is not None
    return found


def test_the_endpoints_that_take_only_body_request_and_state_are_called_directly() -> None:
    assert _direct(completions.router) == {"/v1/chat/completions": True, "/v1/completions": True}
    assert _direct(embeddings.router) == {
        "/v1/embeddings": True,
        "/v1/rerank": True,
        "/v1/score": True,
    }
    assert _direct(messages.router) == {"/v1/messages": True}
    assert _direct(messages.counting) == {"/v1/messages/count_tokens": True}
    # Dependencies of their own (the permitted models, the key id): FastAPI's handler.
    assert not any(_direct(tokenize.router).values())
    assert not any(_direct(responses.router).values())


def test_a_valid_small_body_skips_fastapis_handler_and_an_invalid_one_takes_it(
    client: tuple[TestClient, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, _ = client
    solved: list[object] = []
    solve = fastapi.routing.solve_dependencies

    async def counted(*args: object, **kwargs: object) -> object:
        solved.append(args)
        return await solve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    answer = post(http, many_parts(2))
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    assert solved == []
    # FastAPI's handler renders the error, as it did for every body before.
    wrong = post(http, many_parts(2, temperature=7))
    assert len(solved) == 1
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "temperature"
    # FastAPI refuses it while parsing, before its dependencies.
    broken = post(http, b'{"model": ')
    assert broken.status_code == 400
    assert "could not parse the JSON body" in broken.json()["error"]["message"]


BODIES: list[tuple[type[BaseModel], dict[str, object]]] = [
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    (
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "2"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
                }
            ],
            "tool_choice": "auto",
            "max_tokens": 5.0,
            "temperature": 0,
            "top_p": 1,
            "n": 2,
            "stop": ["\n", "END"],
            "seed": 2**40,
            "logit_bias": {"42": -100},
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object"}},
            },
            "metadata": {"team": "a"},
            "user": "u-1",
        },
    ),
    (CompletionRequest, {"model": "m", "prompt": [[1, 2, 3], [4]], "echo": True, "best_of": 1}),
    (CompletionRequest, {"model": "m", "prompt": ["a", "b"], "suffix": None, "max_tokens": 3}),
    (EmbeddingRequest, {"model": "m", "input": ["a", "b"], "dimensions": 8}),
    (EmbeddingRequest, {"model": "m", "input": [[1, 2], [3]], "encoding_format": "base64"}),
    (
        MessagesRequest,
        {
            "model": "m",
            "max_tokens": 16,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "again"}]},
            ],
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "stream": True,
        },
    ),
]


@pytest.mark.parametrize(("model", "body"), BODIES)
def test_a_body_validated_from_its_bytes_is_what_fastapi_would_have_validated(
    model: type[BaseModel], body: dict[str, object]
) -> None:
    raw = json.dumps(body).encode()
    assert model.model_validate_json(raw) == model.model_validate(json.loads(raw))
