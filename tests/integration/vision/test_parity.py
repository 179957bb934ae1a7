"""Answers of a vision model through the gateway, against vLLM's own server on the same model,
template and images: greedy, so the text and the prompt's tokens (the images' among them) must
be the same, on chat completions, the Messages API and the Responses API, streamed and not,
for images inline (`data:` URIs, base64 sources) and by URL (the gateway fetches; vLLM's
server fetches its own copy), one image or two, after a system prompt. The model's answers
are nonsense, but they depend on the image: different images give different answers."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.integration.vision.conftest import IMAGE_HOST, SERVED, Pair
from tests.support.media_server import MediaServer, answer, media_server, png
from tests.support.metrics import metric_value

pytestmark = pytest.mark.timeout(900)

RED = png(64, 64, (220, 30, 30))
BLUE = png(48, 80, (20, 40, 230))


def inline(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture
async def images() -> AsyncIterator[MediaServer]:
    async with media_server(IMAGE_HOST, {"/red.png": answer(RED), "/blue.png": answer(BLUE)}) as s:
        yield s


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int


def chat(*urls: str, text: str = "Describe the picture.") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {
        "model": SERVED,
        "temperature": 0,
        "max_tokens": 12,
        "messages": [
            {"role": "system", "content": "You describe pictures."},
            {"role": "user", "content": parts},
        ],
    }


async def ask(base: str, body: dict[str, Any], stream: bool) -> Answer:
    body = {**body, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with httpx.AsyncClient(timeout=180) as client:
        response = await client.post(
            f"{base}/chat/completions", json=body, headers={"cache-control": "no-cache"}
        )
    assert response.status_code == 200, response.text
    if not stream:
        data = response.json()
        return Answer(data["choices"][0]["message"]["content"], data["usage"]["prompt_tokens"])
    text, usage = [], {}
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            text += [c["delta"].get("content") or "" for c in chunk["choices"]]
            usage = chunk.get("usage") or usage
    return Answer("".join(text), usage["prompt_tokens"])


async def both(pair: Pair, body: dict[str, Any], stream: bool) -> Answer:
    theirs = await ask(pair.vllm, body, stream)
    ours = await ask(pair.gateway.url + "/v1", body, stream)
    assert ours == theirs
    return ours


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("by", ["inline", "url"])
async def test_one_image_answers_as_vllms_server(
    pair: Pair, images: MediaServer, stream: bool, by: str
) -> None:
    url = inline(RED) if by == "inline" else images.url("/red.png")
    answer = await both(pair, chat(url), stream)
    assert answer.text
    text_only = await both(pair, chat(), stream)
    # The image's own tokens are in the prompt (Idefics3 puts 16 and its markers per tile).
    assert answer.prompt_tokens > text_only.prompt_tokens + 16


async def test_two_images_and_different_images(pair: Pair, images: MediaServer) -> None:
    red = await both(pair, chat(inline(RED)), stream=False)
    blue = await both(pair, chat(images.url("/blue.png")), stream=False)
    assert red.text != blue.text
    await both(pair, chat(inline(RED), images.url("/blue.png")), stream=False)


async def test_the_cache_keys_an_image_by_its_bytes_not_its_url(
    pair: Pair, images: MediaServer
) -> None:
    """The same bytes inline and by URL are one entry; the URL's bytes changing are another."""
    body = chat(inline(BLUE), text="Which colour?")
    url = pair.gateway.url + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=180) as client:
        first = await client.post(url, json=body)
        assert first.headers["x-cache"] == "MISS", first.text
        by_url = chat(images.url("/blue.png"), text="Which colour?")
        again = await client.post(url, json=by_url)
        assert again.headers["x-cache"] == "HIT"
        assert again.json()["choices"] == first.json()["choices"]
        images.routes["/blue.png"] = answer(RED)
        changed = await client.post(url, json=by_url)
        assert changed.headers["x-cache"] == "MISS"
    fetched = metric_value(pair.gateway.url, "sluicegate_media_fetches_total", outcome="ok")
    assert fetched >= 2


async def post(url: str, body: dict[str, Any]) -> tuple[str, int]:
    """The answer's text and its input tokens, from a Messages or Responses body or stream."""
    async with httpx.AsyncClient(timeout=180) as client:
        response = await client.post(url, json=body, headers={"cache-control": "no-cache"})
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        answer: dict[str, Any] = response.json()
        if "content" in answer:  # a message
            text = "".join(b["text"] for b in answer["content"] if b["type"] == "text")
        else:  # a response
            text = "".join(
                part["text"]
                for item in answer["output"]
                if item["type"] == "message"
                for part in item["content"]
            )
        return text, answer["usage"]["input_tokens"]
    pieces, tokens = [], 0
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        kind = event["type"]
        if kind == "content_block_delta" and event["delta"]["type"] == "text_delta":
            pieces.append(event["delta"]["text"])
        elif kind == "message_start":
            tokens = event["message"]["usage"]["input_tokens"]
        elif kind == "response.output_text.delta":
            pieces.append(event["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            # OpenAI ends a response cut at max_output_tokens with `response.incomplete`
            # (as the gateway does); vLLM's server with `response.completed`.
            tokens = event["response"]["usage"]["input_tokens"]
    return "".join(pieces), tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("by", ["inline", "url"])
async def test_messages_image_blocks_answer_as_vllms_server(
    pair: Pair, images: MediaServer, by: str, stream: bool
) -> None:
    source = (
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(RED).decode()}
        if by == "inline"
        else {"type": "url", "url": images.url("/red.png")}
    )
    content = [
        {"type": "text", "text": "Describe the picture."},
        {"type": "image", "source": source},
    ]
    body = {
        "model": SERVED,
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    theirs = await post(pair.vllm.removesuffix("/v1") + "/v1/messages", body)
    ours = await post(pair.gateway.url + "/v1/messages", body)
    assert ours == theirs and ours[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("by", ["inline", "url"])
async def test_responses_input_images_answer_as_vllms_server(
    pair: Pair, images: MediaServer, by: str, stream: bool
) -> None:
    url = inline(BLUE) if by == "inline" else images.url("/blue.png")
    content = [
        {"type": "input_text", "text": "Describe the picture."},
        {"type": "input_image", "image_url": url},
    ]
    body = {
        "model": SERVED,
        "max_output_tokens": 12,
        "temperature": 0,
        "store": False,
        "stream": stream,
        "input": [{"role": "user", "content": content}],
    }
    theirs = await post(pair.vllm + "/responses", body)
    ours = await post(pair.gateway.url + "/v1/responses", body)
    assert ours == theirs and ours[0]
