"""The token budget against the real engine: counts, headers, and a small context window."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import BYPASS_CACHE, chat_prompt_tokens
from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway
from tests.support.metrics import metric_value

SMALL_CONTEXT = 512


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    for i in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Question {i}: what is {i} plus {i}? Please explain it step by step.",
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"{i} plus {i} is {2 * i}. Adding a number to itself doubles it.",
            }
        )
    messages.append({"role": "user", "content": "Thanks. What is 2 plus 3?"})
    return messages


def budget_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-budget-")}


# ---- on the session gateway (2048-token context) ------------------------------------------


def test_prompt_tokens_equal_the_engines_usage_and_the_headers(
    client: OpenAI, model: str, tokenizer: object
) -> None:
    messages = conversation(3)
    exact = chat_prompt_tokens(tokenizer, messages)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=8,  # type: ignore[arg-type]
    )
    reply = raw.parse()
    assert reply.usage is not None and reply.usage.prompt_tokens == exact
    headers = budget_headers(raw.headers)
    assert headers == {
        "x-budget-prompt-tokens-before": str(exact),
        "x-budget-prompt-tokens-after": str(exact),
        "x-budget-messages-dropped": "0",
        "x-budget-truncation": "none",
        "x-budget-max-tokens": "8",
        "x-budget-max-tokens-source": "client",
    }


def test_streamed_responses_carry_the_headers_and_the_same_usage(
    base_url: str, model: str, tokenizer: object
) -> None:
    messages = conversation(2)
    body = {
        "model": model,
        "messages": messages,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{base_url}/v1/chat/completions", json=body, headers=BYPASS_CACHE, timeout=120
    ) as response:
        assert response.status_code == 200
        headers = budget_headers(response.headers)
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    usage = json.loads(events[-2])["usage"]
    exact = chat_prompt_tokens(tokenizer, messages)
    assert usage["prompt_tokens"] == exact == int(headers["x-budget-prompt-tokens-after"])
    assert headers["x-budget-max-tokens-source"] == "default"
    assert int(headers["x-budget-max-tokens"]) == int((2048 - exact) * 0.7)
    assert usage["completion_tokens"] <= int(headers["x-budget-max-tokens"])


def test_cached_answers_carry_the_budget_headers(base_url: str, model: str) -> None:
    body = {
        "model": model,
        "messages": conversation(1),
        "temperature": 0,
        "max_tokens": 4096,
        "stop": ["\n"],
    }
    first = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    second = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert first.status_code == second.status_code == 200
    assert second.headers["x-cache"] == "HIT"
    assert budget_headers(second.headers) == budget_headers(first.headers)
    assert first.headers["x-budget-max-tokens-source"] == "clamped"


# ---- on a gateway with a 512-token context --------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path_factory.mktemp("budget"),
        env={"SLUICEGATE_MAX_MODEL_LEN": str(SMALL_CONTEXT)},
    ) as process:
        yield process


def post(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, headers=BYPASS_CACHE, timeout=300)


def test_a_40_turn_conversation_is_trimmed_and_served(
    small: GatewayProcess, tokenizer: object
) -> None:
    messages = conversation(40)
    before = chat_prompt_tokens(tokenizer, messages)
    assert before > 4 * SMALL_CONTEXT
    trimmed = metric_value(small.url, "sluicegate_budget_trimmed_requests_total")
    dropped = metric_value(small.url, "sluicegate_budget_dropped_tokens_total")
    for stream in (False, True):
        body = {"model": MODEL_NAME, "messages": messages, "temperature": 0, "stream": stream}
        response = post(small, "/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        headers = budget_headers(response.headers)
        after = int(headers["x-budget-prompt-tokens-after"])
        assert int(headers["x-budget-prompt-tokens-before"]) == before
        assert after <= SMALL_CONTEXT - 16
        assert int(headers["x-budget-messages-dropped"]) > 40
        assert "drop_turns" in headers["x-budget-truncation"]
        assert int(headers["x-budget-max-tokens"]) + after <= SMALL_CONTEXT
        if not stream:
            reply = response.json()
            assert reply["usage"]["prompt_tokens"] == after
            assert reply["choices"][0]["finish_reason"] in ("stop", "length")
        else:
            assert response.text.rstrip().endswith("data: [DONE]")
            assert '"error"' not in response.text
    assert metric_value(small.url, "sluicegate_budget_trimmed_requests_total") == trimmed + 2
    assert metric_value(small.url, "sluicegate_budget_dropped_tokens_total") > dropped


@pytest.mark.parametrize("max_tokens", [SMALL_CONTEXT, 4096, 10**6, 2**31, 2**63 - 1])
def test_oversized_max_tokens_are_clamped_and_served(
    small: GatewayProcess, max_tokens: int
) -> None:
    clamped = metric_value(small.url, "sluicegate_budget_clamped_max_tokens_total")
    for path, body in (
        ("/v1/chat/completions", {"messages": conversation(40)}),
        ("/v1/chat/completions", {"messages": conversation(0), "stop": ["\n", "."]}),
        ("/v1/completions", {"prompt": "Count: 1, 2, 3,", "stop": ["\n", " 9"]}),
    ):
        full = {"model": MODEL_NAME, "temperature": 0, "max_tokens": max_tokens, **body}
        response = post(small, path, full)
        assert response.status_code == 200, response.text
        headers = budget_headers(response.headers)
        assert headers["x-budget-max-tokens-source"] == "clamped"
        after = int(headers["x-budget-prompt-tokens-after"])
        assert int(headers["x-budget-max-tokens"]) == SMALL_CONTEXT - after
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] == after
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= SMALL_CONTEXT
    assert metric_value(small.url, "sluicegate_budget_clamped_max_tokens_total") == clamped + 3


def test_long_text_prompts_keep_their_end_when_asked(small: GatewayProcess) -> None:
    prompt = " ".join(f"item {i}," for i in range(400)) + " and the last item is"
    refused = post(small, "/v1/completions", {"model": MODEL_NAME, "prompt": prompt})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    body = {"model": MODEL_NAME, "prompt": prompt, "truncation": "auto", "max_tokens": 4}
    response = post(small, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert response.headers["x-budget-truncation"] == "cut_prompt"
    assert response.json()["usage"]["prompt_tokens"] == SMALL_CONTEXT - 4


def test_a_last_message_too_long_alone_is_still_a_400(small: GatewayProcess) -> None:
    messages = [*conversation(3)[:-1], {"role": "user", "content": "word " * 2000}]
    response = post(small, "/v1/chat/completions", {"model": MODEL_NAME, "messages": messages})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "512 tokens" in error["message"] and "last user message" in error["message"]
