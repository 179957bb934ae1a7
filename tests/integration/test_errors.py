"""Every error the core promises, in OpenAI's envelope, over real HTTP."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from openai import OpenAI

from tests.support.gateway import GatewayProcess


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
            "tools.0.function",
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
    ready = httpx.get(f"{base_url}/ready").json()
    assert ready["status"] == "ready"
    # Which models can serve (a vLLM server, checked with the same test, says no more).
    assert set(ready.get("models", {}).values()) <= {"ready"}


def test_oversize_body_is_a_413_before_it_is_read(base_url: str, model: str) -> None:
    huge = {"model": model, "messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    response = chat(base_url, huge)
    assert_error(response, 413, "request_too_large")


def test_too_many_messages_or_choices_are_400s(base_url: str, model: str) -> None:
    many = {"model": model, "messages": [{"role": "user", "content": "x"}] * 2049}
    assert assert_error(chat(base_url, many), 400)["param"] == "messages"
    wide = {"model": model, "messages": [{"role": "user", "content": "x"}], "n": 17}
    assert assert_error(chat(base_url, wide), 400)["param"] == "n"


def post_raw(base_url: str, path: str, raw: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}{path}",
        content=raw.encode(),
        headers={"content-type": "application/json", "cache-control": "no-cache"},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", '"messages": [{"role": "user", "content": "a\\ud800"}]',
         "messages.0.content"),
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]',
         "messages.0.content.0.text"),
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi", "name": "\\ud800"}]', "messages.0.name"),
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi"}], "stop": ["\\ud800"]', "stop.0"),
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi"}], "user": "\\udbff"', "user"),
        ("/v1/completions", '"prompt": "\\ud800"', "prompt"),
        ("/v1/completions", '"prompt": ["ok", "\\udc00"]', "prompt.1"),
    ],
)  # fmt: skip
def test_lone_surrogates_are_400s_naming_the_field(
    base_url: str, model: str, path: str, body: str, param: str
) -> None:
    raw = f'{{"model": "{model}", "max_tokens": 2, {body}}}'
    error = assert_error(post_raw(base_url, path, raw), 400)
    assert error["param"] == param
    assert "surrogate" in error["message"]


def test_a_lone_surrogate_in_the_model_name_is_a_400(base_url: str) -> None:
    raw = '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'
    assert assert_error(post_raw(base_url, "/v1/chat/completions", raw), 400)["param"] == "model"


def test_surrogate_pairs_are_text(base_url: str, model: str) -> None:
    raw = (
        f'{{"model": "{model}", "max_tokens": 2, '
        '"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "stop": ["\\ud83d\\ude00"]}'
    )
    assert post_raw(base_url, "/v1/chat/completions", raw).status_code == 200


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": 2**64}, "top_k"),  # was a 500: the engine's transport stores 64 bits
        ({"top_k": 10**30}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"min_tokens": 2**63}, "min_tokens"),
        ({"seed": 2**63}, "seed"),
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ({"stop": [f"s{i}" for i in range(65)]}, "stop"),
        ({"stop": "x" * 1025}, "stop"),
    ],
)
def test_values_the_engine_cannot_take_are_400s_naming_the_parameter(
    base_url: str, model: str, extra: dict[str, Any], param: str
) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert assert_error(chat(base_url, {**body, **extra}), 400)["param"] == param


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": 2**31 - 1},  # above the vocabulary: vLLM lowers it to the vocabulary
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"min_tokens": 2, "max_tokens": 2},
        {"logprobs": True, "top_logprobs": 20},
        {"presence_penalty": 2, "frequency_penalty": -2, "repetition_penalty": 10},
        {"temperature": 2, "top_p": 1e-300, "min_p": 1},
        {"stop": ["x" * 1024] * 64, "n": 4},
    ],
)
def test_the_extreme_values_accepted_run_on_the_engine(
    base_url: str, model: str, extra: dict[str, Any]
) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = chat(base_url, {**body, **extra}, headers={"cache-control": "no-cache"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_two_hundred_thousand_stop_strings_are_refused_at_once(base_url: str, model: str) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stop": [f"stop-{i}" for i in range(200_000)],
        "n": 4,
        "max_tokens": 64,
    }
    started = time.perf_counter()
    error = assert_error(chat(base_url, body), 400)
    took = time.perf_counter() - started
    assert error["param"] == "stop"
    # At once: 0.6 s alone (a 200 after 25 s, with /health stalled 15 s, before); the bound
    # is a stall, with room for a loaded two-core machine.
    assert took < 5, f"the refusal took {took:.1f} s"


def test_a_path_cannot_forge_a_log_line(gateway: GatewayProcess) -> None:
    forged = "2026-01-01 00:00:00,000 INFO sluicegate.access: GET /forged status=200"
    path = "/v1/nope%0A" + quote(forged) + "%1B[31m%7F"
    assert_error(httpx.get(gateway.url + path), 404)
    deadline = time.monotonic() + 5
    while "GET /v1/nope\\n2026" not in gateway.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = gateway.log()
    assert "GET /v1/nope\\n2026-01-01 00:00:00,000 INFO" in log
    assert "\\x1b[31m\\x7f" in log
    assert not [line for line in log.splitlines() if line.startswith(forged)]
