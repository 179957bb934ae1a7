"""Content parts: text (and assistant refusals) reach the model; other types are refused as
text-only, with the same 400 whether the body is small or parsed in the worker process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sluicegate.api.route import LARGE_BODY_BYTES
from sluicegate.wire.requests import ChatCompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    with serve_in_thread(fake_app(FakeEngine(max_model_len=200_000))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            yield client


def chat(parts: list[dict[str, Any]], filler: int = 0) -> dict[str, Any]:
    return {
        "model": FAKE_MODEL,
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "s" * filler},
            {"role": "user", "content": parts},
        ],
    }


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "video_url", "video_url": {"url": "x"}},
    ],
)
@pytest.mark.parametrize("filler", [0, LARGE_BODY_BYTES + 1], ids=["small", "large"])
async def test_non_text_parts_are_refused_as_text_only(
    http: httpx.AsyncClient, part: dict[str, Any], filler: int
) -> None:
    response = await http.post(
        "/v1/chat/completions", json=chat([{"type": "text", "text": "a"}, part], filler)
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages.1.content.1"
    assert error["message"] == (
        "Invalid value for 'messages.1.content.1': this model takes text only: content parts "
        f"of type '{part['type']}' are not supported (send 'text' parts)."
    )


async def test_refusal_parts_are_text_in_assistant_messages_only(
    http: httpx.AsyncClient,
) -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
                {"role": "user", "content": "why"},
            ],
        }
    )
    assert request.prompt_messages()[1] == {"role": "assistant", "content": "No."}
    response = await http.post(
        "/v1/chat/completions", json=chat([{"type": "refusal", "refusal": "No."}])
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.1.content.0"


async def test_a_text_part_without_text_is_missing_it(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/chat/completions", json=chat([{"type": "text"}]))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages.1.content.0.text"


@pytest.mark.parametrize("filler", [0, LARGE_BODY_BYTES + 1], ids=["small", "large"])
async def test_a_model_that_reads_images_gets_them_from_small_and_large_bodies(
    filler: int,
) -> None:
    """A large body is parsed in a worker process and handed on in a compact form, which joins
    text parts: a message with images keeps its parts."""
    engine = FakeEngine(max_model_len=200_000, takes_images=True)
    pixel = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLv"
        "AAAAAElFTkSuQmCC"
    )
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}}
    with serve_in_thread(fake_app(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = chat([{"type": "text", "text": "a"}, image], filler)
            response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    (prompt,) = engine.prompts
    assert [i.media_type for i in prompt.images] == ["image/png"]
    # The fake engine's 16 tokens an image, beside the text's ids.
    assert response.json()["usage"]["prompt_tokens"] == len(prompt.ids) + 16
