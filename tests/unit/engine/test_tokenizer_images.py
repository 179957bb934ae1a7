"""A chat's images as the template gets them (`ImageTemplate`), on the bundled model's
tokenizer with the vision test model's template (`<image>` where a part is an image): in
vLLM's "openai" content format the template places each image itself; in its "string" format
the placeholders go first, as vLLM's server puts them; without a template for images (an
upstream's count) the text alone is rendered. The vision parity tests hold the prompts to
vLLM's server's."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.engine.tokenizer import HFPromptTokenizer, ImageTemplate
from sluicegate.errors import InvalidRequestError
from sluicegate.wire.requests import ChatCompletionRequest
from tests.support.vision_model import TEMPLATE

PLAIN = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""A template that takes content as text only (vLLM's "string" format)."""
PARTS_ONLY = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- else -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
)
"""A template that reads content as parts only, as SmolVLM's does (vLLM's "openai" format)."""
IMAGES = ("<image>",) * 8
NUMBERED = tuple(f"<|image_{n}|>" for n in range(1, 9))


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    return AutoTokenizer.from_pretrained(str(bundled_model_dir(Settings().model_cache_dir)))


def messages(*texts: str, images: int = 2) -> list[dict[str, Any]]:
    """A system turn, then a user turn of `texts` ("Compare", "with" by default) with
    `images` images after the first."""
    words = list(texts or ("Compare", "with"))
    parts: list[dict[str, Any]] = [{"type": "text", "text": w} for w in words[:1]]
    for k in range(images):
        parts.append({"type": "image_url", "image_url": {"url": "data:,"}})
        parts += [{"type": "text", "text": w} for w in words[1 + k : 2 + k]]
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "brief"},
                {"role": "user", "content": parts},
            ],
        }
    )
    return request.prompt_messages()


async def test_the_openai_format_places_each_image_where_its_part_is(hf_tokenizer: Any) -> None:
    tokenizer = HFPromptTokenizer(
        hf_tokenizer, chat_template=TEMPLATE, images=ImageTemplate("openai", IMAGES)
    )
    text = await tokenizer.render_chat(messages())
    assert "<|im_start|>user\nCompare<image>with<image><|im_end|>" in text


async def test_the_string_format_puts_the_placeholders_first(hf_tokenizer: Any) -> None:
    tokenizer = HFPromptTokenizer(
        hf_tokenizer, chat_template=PLAIN, images=ImageTemplate("string", IMAGES)
    )
    text = await tokenizer.render_chat(messages())
    # vLLM's `_get_full_multimodal_text_prompt`: placeholders, then the texts, by "\n".
    assert "<|im_start|>user\n<image>\n<image>\nCompare\nwith<|im_end|>" in text


async def test_without_an_image_template_the_text_alone_is_rendered(hf_tokenizer: Any) -> None:
    tokenizer = HFPromptTokenizer(hf_tokenizer, chat_template=TEMPLATE)
    text = await tokenizer.render_chat(messages())
    assert "<|im_start|>user\nCompare\nwith<|im_end|>" in text
    assert "<image>" not in text
    encoding = await tokenizer.encode_chat_counted(messages())
    assert encoding.length == len(await tokenizer.encode_chat(messages()))


async def test_the_memo_tells_images_apart_from_text(hf_tokenizer: Any) -> None:
    tokenizer = HFPromptTokenizer(
        hf_tokenizer, chat_template=TEMPLATE, images=ImageTemplate("openai", IMAGES)
    )
    with_images = await tokenizer.encode_chat(messages())
    text_only = messages()
    del text_only[1]["parts"]
    assert await tokenizer.encode_chat(text_only) != with_images
    assert await tokenizer.encode_chat(messages()) == with_images


async def test_the_openai_format_gives_text_messages_as_parts_too(hf_tokenizer: Any) -> None:
    """A template that reads parts only (SmolVLM's) still sees the system prompt: every
    message's text goes as a text part, as vLLM's renderer gives it."""
    tokenizer = HFPromptTokenizer(
        hf_tokenizer, chat_template=PARTS_ONLY, images=ImageTemplate("openai", IMAGES)
    )
    text = await tokenizer.render_chat(messages())
    assert text.startswith("<|im_start|>system\nbrief<|im_end|>\n")


async def test_the_string_format_follows_vllms_placement(hf_tokenizer: Any) -> None:
    """As vLLM's `_get_full_multimodal_text_prompt`: a placeholder the client wrote stands
    for an image, an image without text is its placeholder alone, numbered placeholders
    count across the conversation, and more placeholders than images is a 400."""
    string = HFPromptTokenizer(
        hf_tokenizer, chat_template=PLAIN, images=ImageTemplate("string", IMAGES)
    )
    written = await string.render_chat(messages("Look at <image> here", images=1))
    assert "<|im_start|>user\nLook at <image> here<|im_end|>" in written
    alone = await string.render_chat(messages("", images=1))
    assert "<|im_start|>user\n<image><|im_end|>" in alone
    numbered = HFPromptTokenizer(
        hf_tokenizer, chat_template=PLAIN, images=ImageTemplate("string", NUMBERED)
    )
    two = await numbered.render_chat(messages())
    assert "<|im_start|>user\n<|image_1|>\n<|image_2|>\nCompare\nwith<|im_end|>" in two
    with pytest.raises(InvalidRequestError):
        await string.render_chat(messages("<image> and <image>", images=1))
