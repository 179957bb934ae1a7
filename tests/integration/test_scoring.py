"""Sampling and scoring over real HTTP against the real engine: logit_bias, completions
`echo` with prompt logprobs, scoring a prompt with max_tokens 0 (lm-eval-harness's
loglikelihood), and the refusals of what the text-only model cannot take."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
from openai import OpenAI

from tests.integration.conftest import BYPASS_CACHE

CONTEXT = "The capital of France is"


def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=BYPASS_CACHE, timeout=120)


def completion(base_url: str, **body: Any) -> dict[str, Any]:
    response = post(base_url, "/v1/completions", {"temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def single_id(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return int(ids[0])


def test_a_minus_100_bias_removes_the_greedy_first_token(
    base_url: str, model: str, tokenizer: Any
) -> None:
    greedy = completion(base_url, model=model, prompt=CONTEXT, max_tokens=1)["choices"][0]["text"]
    banned = single_id(tokenizer, greedy)
    biased = completion(
        base_url, model=model, prompt=CONTEXT, max_tokens=1, logit_bias={str(banned): -100}
    )["choices"][0]["text"]
    assert biased != greedy


def test_a_plus_100_bias_forces_a_token_in_chat(client: OpenAI, model: str, tokenizer: Any) -> None:
    forced = single_id(tokenizer, " banana")
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name a colour."}],
        temperature=0,
        max_tokens=3,
        logit_bias={str(forced): 100},
    )
    assert reply.choices[0].message.content == " banana" * 3


def test_echo_scores_every_prompt_token_with_max_tokens_0(base_url: str, model: str) -> None:
    prompt = "Sluices hold the water back until the gate opens."
    tokenized = post(base_url, "/tokenize", {"model": model, "prompt": prompt}).json()
    body = completion(base_url, model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == prompt
    assert len(logprobs["tokens"]) == tokenized["count"] == body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 0
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert all(len(top) >= 1 for top in logprobs["top_logprobs"][1:])
    assert "".join(logprobs["tokens"]) == prompt
    offsets = logprobs["text_offset"]
    assert offsets == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(offsets))]


def test_lm_eval_loglikelihood_matches_the_greedy_continuation(base_url: str, model: str) -> None:
    """lm-eval-harness scores `continuation` after `context` as: prompt = context +
    continuation, echo, logprobs 1, max_tokens 0; the continuation's logprobs are the tokens
    after the context's, and it is greedy when each is its position's top token."""
    generated = completion(base_url, model=model, prompt=CONTEXT, max_tokens=1, logprobs=1)
    continuation = generated["choices"][0]["text"]
    generated_logprob = generated["choices"][0]["logprobs"]["token_logprobs"][0]
    context_tokens = post(base_url, "/tokenize", {"model": model, "prompt": CONTEXT}).json()
    scored = completion(
        base_url, model=model, prompt=CONTEXT + continuation, max_tokens=0, echo=True, logprobs=1
    )["choices"][0]["logprobs"]
    start = context_tokens["count"]
    assert "".join(scored["tokens"][start:]) == continuation
    loglikelihood = sum(scored["token_logprobs"][start:])
    is_greedy = all(
        max(top, key=top.__getitem__) == token
        for token, top in zip(scored["tokens"][start:], scored["top_logprobs"][start:], strict=True)
    )
    assert is_greedy
    # Prefill and decode compute the same logprob, up to float32 rounding.
    assert math.isclose(loglikelihood, generated_logprob, abs_tol=1e-2)
    # With logprobs 0 (lm-eval's other setting) each position still lists its own token, as
    # OpenAI's legacy API and vLLM's server do, so the harness's `max(top_logprobs)` works.
    bare = completion(
        base_url, model=model, prompt=CONTEXT + continuation, max_tokens=0, echo=True, logprobs=0
    )["choices"][0]["logprobs"]
    assert bare["tokens"] == scored["tokens"]
    assert bare["top_logprobs"][1:] == [
        {token: logprob}
        for token, logprob in zip(bare["tokens"][1:], bare["token_logprobs"][1:], strict=True)
    ]


def test_streamed_echo_equals_non_streamed(base_url: str, model: str) -> None:
    body = {"model": model, "prompt": CONTEXT, "max_tokens": 4, "echo": True, "logprobs": 0}
    whole = completion(base_url, **body)["choices"][0]
    with httpx.stream(
        "POST",
        f"{base_url}/v1/completions",
        json={**body, "temperature": 0, "stream": True},
        headers=BYPASS_CACHE,
        timeout=120,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line.removeprefix("data: "))["choices"][0] for line in lines]
    assert chunks[0]["text"] == CONTEXT  # the echoed prompt comes first
    assert "".join(c["text"] for c in chunks) == whole["text"]
    streamed_tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed_tokens == whole["logprobs"]["tokens"]
    offsets = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert offsets == whole["logprobs"]["text_offset"]


def test_scoring_errors_are_400s_naming_the_param(base_url: str, model: str) -> None:
    cases = [
        ({"prompt": CONTEXT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": CONTEXT, "logit_bias": {"49152": 1}}, "logit_bias"),
        ({"prompt": CONTEXT, "logit_bias": {"one": 1}}, "logit_bias"),
        ({"prompt": CONTEXT, "logit_bias": {"1": -101}}, "logit_bias"),
        ({"prompt": CONTEXT, "suffix": " end"}, "suffix"),
        ({"prompt": CONTEXT, "best_of": 2}, "best_of"),
    ]
    for extra, param in cases:
        response = post(base_url, "/v1/completions", {"model": model, "max_tokens": 1, **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        if param in ("suffix", "best_of"):
            assert "not supported" in error["message"]


def test_image_and_audio_parts_are_refused_small_or_large(base_url: str, model: str) -> None:
    for filler in (0, 200 * 1024):  # the large one is parsed in the worker process
        for part in (
            # On loopback (the discard port): a test's URL never leads off the machine.
            {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        ):
            messages = [
                {"role": "system", "content": "x" * filler},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
            ]
            response = post(
                base_url, "/v1/chat/completions", {"model": model, "messages": messages}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "messages.1.content.1"
            assert "text only" in error["message"]
