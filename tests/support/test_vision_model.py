"""The vision model the tests make (tests/support/vision_model.py), itself checked in
transformers: its image tokens on SmolLM2's spare ids, one image a fixed number of prompt
tokens, and greedy answers that depend on the image."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.support.vision_model import IMAGE_SEQ_LEN, TOKENS, vision_model

ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]


@pytest.fixture(scope="module")
def folder() -> Path:
    return vision_model()


def test_the_image_tokens_sit_on_spare_ids_and_the_vocabulary_stays(folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == 49152
    assert tokenizer.convert_ids_to_tokens(list(TOKENS)) == list(TOKENS.values())


def test_an_image_takes_its_tiles_tokens_and_changes_the_greedy_answer(folder: Path) -> None:
    import torch
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    model = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    prompt = processor.apply_chat_template(ASK, add_generation_prompt=True)
    text_only = len(processor.tokenizer(prompt)["input_ids"])
    answers = []
    for color, size in (((255, 0, 0), (100, 80)), ((0, 0, 255), (30, 90))):
        inputs = processor(text=prompt, images=[Image.new("RGB", size, color)], return_tensors="pt")
        # The placeholder becomes the tile's tokens between its markers, at any image size.
        assert inputs["input_ids"].shape[1] == text_only - 1 + IMAGE_SEQ_LEN + 3
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        answers.append(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :]))
    assert answers[0] != answers[1]
