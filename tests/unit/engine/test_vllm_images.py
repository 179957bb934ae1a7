"""The in-process engine's images over a stand-in for vLLM's renderer (no engine): each image's
tokens counted by the processor on the image alone, outside vLLM's sender cache
(`skip_mm_cache`), once per distinct image; the prompt processed right before it goes in with
the images' digests as their multimodal ids; an image the processor refuses named by its
position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sluicegate.engine.protocol import Prompt, PromptImage
from sluicegate.engine.tokenizer import ImageTemplate
from sluicegate.engine.vllm_images import VLLMImages
from sluicegate.errors import MediaError

PLACEHOLDER_ID = 3


@dataclass
class StubRenderer:
    """Expands each placeholder id into `tokens` ids, as a processor would."""

    tokens: int = 17
    refuse: str | None = None
    calls: list[tuple[dict[str, Any], bool]] = field(default_factory=list)

    async def process_for_engine_async(
        self, prompt: dict[str, Any], arrival_time: float, *, skip_mm_cache: bool = False
    ) -> dict[str, Any]:
        self.calls.append((prompt, skip_mm_cache))
        if self.refuse is not None:
            raise ValueError(self.refuse)
        ids: list[int] = []
        for token in prompt["prompt_token_ids"]:
            ids += [PLACEHOLDER_ID] * self.tokens if token == PLACEHOLDER_ID else [token]
        return {"type": "multimodal", "prompt_token_ids": ids, "arrival_time": arrival_time}


class StubTokenizer:
    images = ImageTemplate("openai", ("<image>",) * 8)

    class hf_tokenizer:
        @staticmethod
        def encode(text: str, add_special_tokens: bool = False) -> list[int]:
            assert text == "<image>"
            return [PLACEHOLDER_ID]


@dataclass
class StubLLM:
    renderer: StubRenderer


def image(digest: str) -> PromptImage:
    return PromptImage(digest * 64, "image/png", b"png", pixels=f"pixels-{digest}")


async def test_counts_come_from_the_processor_outside_the_sender_cache_once_each() -> None:
    renderer = StubRenderer()
    images = VLLMImages(StubLLM(renderer), StubTokenizer())  # type: ignore[arg-type]
    assert await images.extra_tokens([image("a"), image("b"), image("a")]) == [16, 16, 16]
    assert await images.extra_tokens([image("a")]) == [16]
    assert len(renderer.calls) == 2  # a and b, once each
    assert all(skip for _, skip in renderer.calls)
    prompt, _ = renderer.calls[0]
    assert prompt["prompt_token_ids"] == [PLACEHOLDER_ID]
    assert prompt["multi_modal_uuids"] == {"image": ["a" * 64]}


async def test_the_prompt_goes_in_with_its_pixels_and_digests() -> None:
    renderer = StubRenderer()
    images = VLLMImages(StubLLM(renderer), StubTokenizer())  # type: ignore[arg-type]
    prompt = Prompt([1, PLACEHOLDER_ID, 2, PLACEHOLDER_ID], images=(image("a"), image("b")))
    given = await images.processed(prompt, arrival_time=123.0)
    assert len(given["prompt_token_ids"]) == 2 + 2 * 17
    sent, skipped = renderer.calls[-1]
    assert not skipped  # what goes in goes through vLLM's cache, as its server's does
    assert sent["multi_modal_data"] == {"image": ["pixels-a", "pixels-b"]}
    assert sent["multi_modal_uuids"] == {"image": ["a" * 64, "b" * 64]}


async def test_an_image_the_processor_refuses_is_named_by_its_position() -> None:
    renderer = StubRenderer(refuse="aspect ratio too extreme")
    images = VLLMImages(StubLLM(renderer), StubTokenizer())  # type: ignore[arg-type]
    with pytest.raises(MediaError) as refused:
        await images.extra_tokens([image("a")])
    assert refused.value.index == 0 and refused.value.reason == "model_refused"
    assert "aspect ratio too extreme" in refused.value.message
