"""`/tokenize` and `/detokenize` through real HTTP, over the fake engine's whitespace
tokenizer (a word's id is its length; id i decodes to i x's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    with serve_in_thread(fake_app(FakeEngine(max_model_len=64), api_keys="sk-test")) as url:
        headers = {"authorization": "Bearer sk-test"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
            yield client


async def test_tokenize_text_answers_in_vllms_shape(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/tokenize", json={"model": FAKE_MODEL, "prompt": "ab c", "return_token_strs": True}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "count": 2,
        "max_model_len": 64,
        "tokens": [2, 1],
        "token_strs": ["ab", "c"],
    }


async def test_tokenize_messages_renders_the_chat_first(http: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    response = await http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == [4, 2]  # "user hi"
    assert response.json()["token_strs"] is None


async def test_detokenize_gives_the_text(http: httpx.AsyncClient) -> None:
    response = await http.post("/detokenize", json={"model": FAKE_MODEL, "tokens": [1, 3]})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": "x xxx"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
        ("/tokenize", {}, 400, None),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400, None),
        (
            "/tokenize",
            {
                "messages": [{"role": "user", "content": "a"}],
                "continue_final_message": True,
            },
            400,
            None,
        ),
        ("/tokenize", {"prompt": "x" * (128 * 64 + 1)}, 400, "prompt"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"tools": 1}},
            400,
            "chat_template_kwargs",
        ),
        ("/detokenize", {"tokens": [1, 1000]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages.0.content.0.image_url",
        ),
        (
            "/tokenize",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                        ],
                    }
                ]
            },
            400,
            "messages.0.content.1",
        ),
    ],
)
async def test_bad_requests_are_refused_naming_the_param(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    response = await http.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


async def test_keys_apply(http: httpx.AsyncClient) -> None:
    response = await http.post("/tokenize", json={"prompt": "a"}, headers={"authorization": ""})
    assert response.status_code == 401
