"""Completions `echo` and prompt logprobs through real HTTP, over the fake engine (whose
prompt logprobs name each id `i` as the token " " + "x" * i, see `tests.support.fakes`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

PROMPT = "one three fives"  # the fake tokenizer's ids: [3, 5, 5]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=["Hi", " there", "!"], max_model_len=256)


@pytest.fixture
async def http(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    with serve_in_thread(fake_app(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "prompt": PROMPT, "temperature": 0, **extra}


async def post(http: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await http.post("/v1/completions", json=body, headers=headers)


def stream_choices(text: str) -> list[dict[str, Any]]:
    return [
        choice
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
        for choice in json.loads(line.removeprefix("data: "))["choices"]
    ]


async def test_echo_puts_the_prompt_before_the_completion(http: httpx.AsyncClient) -> None:
    body = (await post(http, completion(max_tokens=2, echo=True))).json()
    assert body["choices"][0]["text"] == PROMPT + "Hi there"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def test_echo_logprobs_cover_prompt_then_completion(http: httpx.AsyncClient) -> None:
    body = (await post(http, completion(max_tokens=2, echo=True, logprobs=1))).json()
    logprobs = body["choices"][0]["logprobs"]
    # The first prompt token is decoded by the tokenizer (fake: 3 x's) and has no logprob.
    assert logprobs["tokens"] == ["xxx", " xxxxx", " xxxxx", "Hi", " there"]
    assert logprobs["token_logprobs"] == [None, -5.0, -5.0, -0.5, -0.5]
    assert logprobs["top_logprobs"][0] is None
    # The scored token is always among the top ones (OpenAI's "up to logprobs + 1").
    assert logprobs["top_logprobs"][1] == {" xxxxx": -5.0, "alt": -9.0}
    # Offsets run on across the prompt's tokens into the completion's.
    assert logprobs["text_offset"] == [0, 3, 9, 15, 17]


async def test_max_tokens_zero_with_echo_scores_the_prompt_only(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    response = await post(http, completion(max_tokens=0, echo=True, logprobs=0))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["text"] == PROMPT
    assert choice["logprobs"]["token_logprobs"] == [None, -5.0, -5.0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 0
    # The engine still generates one token (vLLM needs max_tokens >= 1); it is dropped.
    options = engine.requests[-1][2]
    assert (options.max_tokens, options.prompt_logprobs) == (1, 0)
    assert response.headers["x-budget-max-tokens"] == "1"


async def test_max_tokens_zero_without_echo_is_a_400(http: httpx.AsyncClient) -> None:
    response = await post(http, completion(max_tokens=0))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


async def test_each_choice_and_prompt_echoes_its_own_prompt(http: httpx.AsyncClient) -> None:
    body = (
        await post(
            http, completion(prompt=["aa b", "ccc"], n=2, temperature=1, echo=True, max_tokens=1)
        )
    ).json()
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    assert texts == ["aa bHi", "aa bHi", "cccHi", "cccHi"]


async def test_token_prompts_echo_their_detokenized_text(http: httpx.AsyncClient) -> None:
    body = (await post(http, completion(prompt=[2, 4], echo=True, max_tokens=1))).json()
    assert body["choices"][0]["text"] == "xx xxxxHi"  # the fake decodes id i as i x's


async def test_streamed_echo_sends_the_prompt_first_and_matches_the_whole_answer(
    http: httpx.AsyncClient,
) -> None:
    whole = (await post(http, completion(max_tokens=3, echo=True, logprobs=1))).json()
    streamed = await post(http, completion(max_tokens=3, echo=True, logprobs=1, stream=True))
    choices = stream_choices(streamed.text)
    assert choices[0]["text"] == PROMPT
    assert choices[0]["logprobs"]["token_logprobs"][0] is None
    assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
    offsets = [o for c in choices if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert offsets == whole["choices"][0]["logprobs"]["text_offset"]


async def test_cached_echo_renders_as_the_run_did(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = completion(max_tokens=2, echo=True, logprobs=1)
    first = await post(http, body)
    hit = await post(http, body)
    streamed_hit = await post(http, {**body, "stream": True})
    assert hit.headers["x-cache"] == "HIT" and streamed_hit.headers["x-cache"] == "HIT"
    assert hit.json()["choices"] == first.json()["choices"]
    choices = stream_choices(streamed_hit.text)
    assert "".join(c["text"] for c in choices) == first.json()["choices"][0]["text"]
    assert len(engine.requests) == 1


async def test_echo_and_scoring_are_keyed_apart_from_plain_runs(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    plain = await post(http, completion(max_tokens=1))
    echoed = await post(http, completion(max_tokens=1, echo=True))
    scored = await post(http, completion(max_tokens=0, echo=True))
    assert [r.headers["x-cache"] for r in (plain, echoed, scored)] == ["MISS"] * 3
    assert [r.json()["choices"][0]["text"] for r in (plain, echoed, scored)] == [
        "Hi",
        PROMPT + "Hi",
        PROMPT,
    ]


async def test_logit_bias_reaches_the_engine_in_id_order(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    response = await post(http, completion(max_tokens=1, logit_bias={"7": 5, "2": -100}))
    assert response.status_code == 200, response.text
    assert engine.requests[-1][2].logit_bias == ((2, -100.0), (7, 5.0))


@pytest.mark.parametrize(
    "bias",
    [{"1000": 1}, {"-1": 1}, {"1.5": 1}, {"1": 100.5}, {str(i): 1 for i in range(1025)}],
)
async def test_bad_logit_bias_is_a_400_naming_it(
    http: httpx.AsyncClient, bias: dict[str, float]
) -> None:
    for path, body in (
        ("/v1/completions", completion(max_tokens=1, logit_bias=bias)),
        (
            "/v1/chat/completions",
            {
                "model": FAKE_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "logit_bias": bias,
            },
        ),
    ):
        response = await http.post(path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "logit_bias"


async def test_a_cut_prompt_echoes_what_the_engine_got(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = completion(prompt="a " * 300, max_tokens=1, echo=True, truncation="auto")
    response = await post(http, body)
    assert response.status_code == 200, response.text
    kept = engine.requests[-1][1]
    assert len(kept) < 300
    assert response.json()["choices"][0]["text"] == " ".join("x" for _ in kept) + "Hi"
