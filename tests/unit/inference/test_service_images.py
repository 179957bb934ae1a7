"""A chat's images through the service, over the fake engine (which reads images or not, and
counts `tokens_per_image` for each): refused by a text-only model before anything is read,
read once however many models prepare the request, carried on the prompt with their tokens
counted by the budget, and in the cache key by their bytes."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from PIL import Image

from sluicegate.cache.key import cache_key
from sluicegate.errors import ContextLengthExceededError, InvalidRequestError, MediaError
from sluicegate.inference.images import RequestImages
from sluicegate.inference.service import CompletionService
from sluicegate.media.loader import ImageSource, LoadedImage, MediaLoader
from sluicegate.wire.requests import ChatCompletionRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine


def png(color: tuple[int, int, int], size: int = 8) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class CountingLoader(MediaLoader):
    """The default loader, counting the requests it reads."""

    def __init__(self) -> None:
        default = MediaLoader.default()
        super().__init__(default.fetcher)
        self.loads = 0

    async def load_all(self, sources: list[ImageSource]) -> list[LoadedImage]:
        self.loads += 1
        return await super().load_all(sources)


def chat(*urls: str, text: str = "what is it", **extra: Any) -> ChatCompletionRequest:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url, "detail": "low"}} for url in urls]
    return ChatCompletionRequest.model_validate(
        {
            "model": FAKE_MODEL,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": parts},
            ],
            **extra,
        }
    )


def images(request: ChatCompletionRequest, loader: MediaLoader) -> RequestImages:
    return RequestImages(request.image_parts(), loader)


async def test_a_text_only_model_refuses_before_reading_anything() -> None:
    loader = CountingLoader()
    service = CompletionService(FakeEngine(max_model_len=256), FAKE_MODEL)
    request = chat(png((255, 0, 0)))
    with pytest.raises(MediaError) as refused:
        await service.prepare_chat(request, images(request, loader))
    assert refused.value.reason == "text_only"
    assert refused.value.param == "messages.1.content.1"
    assert loader.loads == 0


async def test_the_prompt_carries_the_images_and_the_budget_counts_them() -> None:
    engine = FakeEngine(max_model_len=256, takes_images=True, tokens_per_image=40)
    service = CompletionService(engine, FAKE_MODEL)
    request = chat(png((255, 0, 0)), png((0, 0, 255)))
    run = await service.prepare_chat(request, images(request, CountingLoader()))
    (prompt,) = run.prompts
    assert [i.media_type for i in prompt.images] == ["image/png", "image/png"]
    assert [i.detail for i in prompt.images] == ["low", "low"]
    assert all(i.url is None for i in prompt.images)  # inline: nothing was fetched
    assert prompt.image_tokens == 80 and prompt.length == len(prompt.ids) + 80
    assert run.prompt_tokens == prompt.length
    assert run.budget is not None and run.budget.prompt_tokens_after == prompt.length
    # The completion gets what the images leave (the default share of what is left).
    text_only = await service.prepare_chat(chat())
    assert run.options.max_tokens < text_only.options.max_tokens
    chat_message = request.prompt_messages()[1]
    assert chat_message["parts"][1:] == [{"type": "image"}, {"type": "image"}]
    assert chat_message["content"] == "what is it"


async def test_images_past_the_window_are_refused_not_truncated() -> None:
    engine = FakeEngine(max_model_len=128, takes_images=True, tokens_per_image=120)
    service = CompletionService(engine, FAKE_MODEL)
    request = chat(png((255, 0, 0)), truncation="auto")
    with pytest.raises(ContextLengthExceededError) as refused:
        await service.prepare_chat(request, images(request, CountingLoader()))
    assert "120 of them for their images" in refused.value.message


async def test_images_are_read_once_for_every_model_that_prepares_the_request() -> None:
    loader = CountingLoader()
    request = chat(png((255, 0, 0)))
    once = images(request, loader)
    for _ in range(2):
        engine = FakeEngine(max_model_len=256, takes_images=True)
        await CompletionService(engine, FAKE_MODEL).prepare_chat(request, once)
    assert loader.loads == 1


async def test_an_upstreams_estimate_gives_way_to_its_count() -> None:
    engine = FakeEngine(
        max_model_len=256, takes_images=True, estimates_images=True, counted_prompt_tokens=77
    )
    service = CompletionService(engine, FAKE_MODEL)
    request = chat(png((255, 0, 0)))
    run = await service.prepare_chat(request, images(request, CountingLoader()))
    assert run.prompts[0].images_estimated and run.prompt_tokens == run.prompts[0].length
    async for _ in service.generate(run):
        pass
    assert run.prompt_tokens == 77


async def test_an_estimate_past_the_window_is_sent_not_refused() -> None:
    """Only the engine knows what an upstream's images take: the completion gets its minimum,
    and the upstream decides."""
    engine = FakeEngine(
        max_model_len=128, takes_images=True, estimates_images=True, tokens_per_image=500
    )
    service = CompletionService(engine, FAKE_MODEL)
    request = chat(png((255, 0, 0)))
    run = await service.prepare_chat(request, images(request, CountingLoader()))
    assert run.options.max_tokens >= 16 and run.prompts[0].image_tokens == 500


async def test_text_past_the_window_is_refused_before_the_images_are_read() -> None:
    loader = CountingLoader()
    engine = FakeEngine(max_model_len=64, takes_images=True)
    request = chat(png((255, 0, 0)), text="word " * 100)
    with pytest.raises(ContextLengthExceededError):
        await CompletionService(engine, FAKE_MODEL).prepare_chat(request, images(request, loader))
    assert loader.loads == 0


async def test_an_image_the_engine_refuses_is_a_400_naming_its_part() -> None:
    engine = FakeEngine(max_model_len=256, takes_images=True, refused_image=1)
    request = chat(png((255, 0, 0)), png((0, 0, 255)))
    with pytest.raises(MediaError) as refused:
        await CompletionService(engine, FAKE_MODEL).prepare_chat(
            request, images(request, CountingLoader())
        )
    assert refused.value.param == "messages.1.content.2"
    assert refused.value.message.startswith("messages.1.content.2: the model cannot read it")


async def test_a_request_with_images_is_never_prepared_without_them() -> None:
    """A caller that does not hand the images in gets a 400, not a prompt whose
    placeholders have no image."""
    engine = FakeEngine(max_model_len=256, takes_images=True)
    with pytest.raises(InvalidRequestError):
        await CompletionService(engine, FAKE_MODEL).prepare_chat(chat(png((255, 0, 0))))


async def test_urls_are_refused_unfetched_when_fetching_is_off() -> None:
    loader = MediaLoader(MediaLoader.default().fetcher, fetch_urls=False)
    engine = FakeEngine(max_model_len=256, takes_images=True)
    request = chat(png((255, 0, 0)), "http://127.0.0.1:9/a.png")
    with pytest.raises(MediaError) as refused:
        await CompletionService(engine, FAKE_MODEL).prepare_chat(request, images(request, loader))
    assert refused.value.reason == "urls_off"
    assert refused.value.param == "messages.1.content.2"


async def test_the_cache_key_holds_the_images_bytes() -> None:
    engine = FakeEngine(max_model_len=256, takes_images=True)
    service = CompletionService(engine, FAKE_MODEL)

    async def key(*urls: str) -> str:
        request = chat(*urls)
        run = await service.prepare_chat(request, images(request, CountingLoader()))
        return cache_key("p", FAKE_MODEL, "", "chat", run.prompts, run.options)

    red, blue = png((255, 0, 0)), png((0, 0, 255))
    assert await key(red) == await key(red)
    assert await key(red) != await key(blue)
    assert await key(red) != await key()
    assert await key(red, blue) != await key(blue, red)
