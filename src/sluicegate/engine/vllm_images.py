"""Images for the in-process engine: how the model's template takes them, how many tokens each
adds, and the prompt vLLM's processor makes of them.

The gateway renders a chat to token ids itself, with one placeholder per image where the
template puts it (`engine.tokenizer.ImageTemplate`); vLLM's multimodal processor expands each
placeholder into the image's tokens. Counting (for the token budget) asks the same processor
on the image alone, with vLLM's `skip_mm_cache`: its sender cache assumes that whatever it
processed reaches the engine core, so only what is submitted may go through it, and only
right before it is (`processed`). Each image's digest is its multimodal id, so the processor's
and the prefix cache's entries are keyed by the bytes the gateway read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sluicegate.engine.protocol import Prompt, PromptImage
from sluicegate.engine.tokenizer import HFPromptTokenizer, ImageTemplate
from sluicegate.errors import MediaError
from sluicegate.lru import BoundedLRU

COUNTS_KEPT = 4096
"""Images whose token counts are remembered (by digest)."""


def image_template(
    llm: Any, model_config: Any, chat_template: str | None, max_images: int
) -> ImageTemplate | None:
    """How the model's template takes images, as vLLM's server detects it; None when the
    model reads none."""
    processor = getattr(llm.renderer, "mm_processor", None)
    if model_config.multimodal_config is None or processor is None:
        return None
    if "image" not in processor.info.get_supported_mm_limits():
        return None
    from vllm.model_executor.model_loader import get_model_cls
    from vllm.renderers.hf import resolve_chat_template_content_format

    model: Any = get_model_cls(model_config)
    # Numbered across the conversation from 1, as vLLM's renderer numbers them.
    placeholders = tuple(model.get_placeholder_str("image", i) for i in range(1, max_images + 1))
    if None in placeholders:
        return None
    content_format = resolve_chat_template_content_format(
        chat_template, None, "auto", llm.get_tokenizer(), model_config=model_config
    )
    return ImageTemplate(content_format, placeholders)


class VLLMImages:
    def __init__(self, llm: Any, tokenizer: HFPromptTokenizer) -> None:
        assert tokenizer.images is not None
        self._llm = llm
        first = tokenizer.images.placeholders[0]
        self._placeholder = list(tokenizer.hf_tokenizer.encode(first, add_special_tokens=False))
        self._counts: BoundedLRU[str, int] = BoundedLRU(COUNTS_KEPT)

    async def extra_tokens(self, images: Sequence[PromptImage]) -> list[int]:
        """The tokens each image adds beyond its placeholder, as vLLM's processor expands it
        (the same for the same bytes: remembered). An image the processor refuses is a
        `MediaError` naming its position among `images` (`MediaError.index`)."""
        from vllm.exceptions import VLLMValidationError

        counts = []
        for index, image in enumerate(images):
            count = self._counts.get(image.digest)
            if count is None:
                try:
                    alone = await self._llm.renderer.process_for_engine_async(
                        _tokens(self._placeholder, (image,)), time.time(), skip_mm_cache=True
                    )
                except (VLLMValidationError, ValueError) as exc:
                    refused = MediaError("model_refused", f"the model cannot read it: {exc}")
                    refused.index = index
                    raise refused from None
                count = len(alone["prompt_token_ids"]) - len(self._placeholder)
                self._counts.put(image.digest, count)
            counts.append(count)
        return counts

    async def processed(self, prompt: Prompt, arrival_time: float) -> Any:
        """The prompt as the engine core takes it, its placeholders expanded."""
        return await self._llm.renderer.process_for_engine_async(
            _tokens(prompt.ids, prompt.images), arrival_time
        )


def _tokens(ids: list[int], images: Sequence[PromptImage]) -> dict[str, Any]:
    return {
        "prompt_token_ids": ids,
        "multi_modal_data": {"image": [image.pixels for image in images]},
        "multi_modal_uuids": {"image": [image.digest for image in images]},
    }
