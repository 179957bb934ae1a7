"""Every error the core promises, in OpenAI's envelope, over real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return dict(error)


def chat(base_url: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", timeout=60, **({"json": body} | kwargs))


def test_malformed_json_is_a_400(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert_error(response, 400)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
            "temperature",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 9},
            "temperature",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            "max_tokens",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream_options": {"include_usage": True},
            },
            "stream_options",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function"}],
            },
            "tools",
        ),
    ],
)
def test_schema_violations_are_400s_naming_the_parameter(
    base_url: str, body: dict[str, Any], param: str
) -> None:
    error = assert_error(chat(base_url, body), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_nan_is_refused(base_url: str, model: str) -> None:
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    response = httpx.post(
        f"{base_url}/v1/chat/completions",
        content=raw % model.encode(),
        headers={"content-type": "application/json"},
    )
    assert assert_error(response, 400)["param"] == "temperature"


def test_unknown_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="gpt-nonexistent", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nonexistent")


def test_prompt_plus_max_tokens_over_the_context_is_clamped(client: OpenAI, model: str) -> None:
    # The token budget lowers max_tokens to what the context leaves instead of refusing
    # (MAX_TOKENS_OVERFLOW=error brings the 400 back; tests/unit/test_budget.py covers it).
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2048,
        stop=["\n", "."],
    )
    reply = raw.parse()
    assert reply.usage is not None
    assert raw.headers["x-budget-max-tokens-source"] == "clamped"
    assert int(raw.headers["x-budget-max-tokens"]) == 2048 - reply.usage.prompt_tokens


def test_prompt_alone_over_the_context_is_a_400(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt="word " * 3000, max_tokens=1)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "word " * 3000}], stream=True
        )
    assert caught.value.code == "context_length_exceeded"


def test_out_of_vocabulary_token_ids_are_a_400(base_url: str, model: str) -> None:
    response = httpx.post(
        f"{base_url}/v1/completions", json={"model": model, "prompt": [1, 2, 10**9]}
    )
    assert assert_error(response, 400)["param"] == "prompt"


def test_greedy_with_n_above_one_is_a_400(base_url: str, model: str) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "temperature": 0,
    }
    assert assert_error(chat(base_url, body), 400)["param"] == "n"


def test_unknown_path_is_an_openai_404(base_url: str) -> None:
    assert_error(httpx.get(f"{base_url}/v1/nothing-here"), 404, "not_found")


def test_wrong_method_is_an_openai_405(base_url: str) -> None:
    assert_error(httpx.get(f"{base_url}/v1/chat/completions"), 405, "method_not_allowed")
    assert_error(httpx.delete(f"{base_url}/v1/models"), 405, "method_not_allowed")


def test_request_id_is_echoed_or_generated(base_url: str) -> None:
    given = httpx.get(f"{base_url}/v1/models", headers={"x-request-id": "trace-abc.123"})
    assert given.headers["x-request-id"] == "trace-abc.123"
    made = httpx.get(f"{base_url}/v1/models")
    assert len(made.headers["x-request-id"]) == 32
    refused = httpx.get(f"{base_url}/v1/models", headers={"x-request-id": "bad id\twith spaces"})
    assert refused.headers["x-request-id"] != "bad id\twith spaces"
    error = httpx.get(f"{base_url}/nope", headers={"x-request-id": "err-1"})
    assert error.headers["x-request-id"] == "err-1"


def test_health_and_ready(base_url: str) -> None:
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{base_url}/ready").json() == {"status": "ready"}


def test_oversize_body_is_a_413_before_it_is_read(base_url: str, model: str) -> None:
    huge = {"model": model, "messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    response = chat(base_url, huge)
    assert_error(response, 413, "request_too_large")


def test_too_many_messages_or_choices_are_400s(base_url: str, model: str) -> None:
    many = {"model": model, "messages": [{"role": "user", "content": "x"}] * 2049}
    assert assert_error(chat(base_url, many), 400)["param"] == "messages"
    wide = {"model": model, "messages": [{"role": "user", "content": "x"}], "n": 17}
    assert assert_error(chat(base_url, wide), 400)["param"] == "n"
