"""A vision-language model made here from the bundled SmolLM2's folder: nothing comes from a hub.

Idefics3 (SmolVLM's architecture), which vLLM serves on CPU without torchvision: a small
vision tower and connector, randomly initialized (seed 0), in front of SmolLM2's own weights,
with the image tokens on SmolLM2's spare special ids (3-10, so the vocabulary stays 49,152)
and a PIL-only image processor that does not split images (one 64x64 tile of 16 tokens).
Its answers are nonsense, but they depend on the image, greedily and the same in
transformers and in vLLM: the path an image takes through a server is real.

The connector's weight is drawn larger than its default (std 0.5/sqrt(fan_in)): at the
default scale the image barely moves the output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.derived_model import derived_model

RECIPE = "vision-v1"
"""Changes when the recipe does: a folder made by another is made again."""
MARKER = ".sluicegate-vision-ready"
IMAGE_TOKEN = "<image>"
TOKENS = {
    3: IMAGE_TOKEN,
    4: "<fake_token_around_image>",
    5: "<global-img>",
    6: "<end_of_utterance>",
    7: "<row_1_col_1>",
    8: "<row_1_col_2>",
    9: "<row_2_col_1>",
    10: "<row_2_col_2>",
}
"""The processor's tokens, on SmolLM2's spare special ids (it adds its own if these are
missing, which would grow the vocabulary past the embedding)."""
IMAGE_SEQ_LEN = 16
TILE = 64
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": TILE,
    "patch_size": 8,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
CONNECTOR = "model.connector.modality_projection.proj.weight"
TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- else -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""SmolLM2's chat format, with `<image>` where a message has an image part."""


def vision_model(folder: Path | None = None) -> Path:
    """The model's folder (about 270 MB, bfloat16 on disk), made once beside the bundled
    model (or in `folder`)."""
    return derived_model("vision", RECIPE, MARKER, _build, folder)


def _build(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True)
    _tokenizer(source, folder)
    _weights(source, folder)
    _processor(folder)


def _tokenizer(source: Path, folder: Path) -> None:
    """SmolLM2's tokenizer with `TOKENS` renamed (special still) and listed as extra special
    tokens, and the chat template."""
    data = json.loads((source / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for token in data["added_tokens"]:
        if token["id"] in TOKENS:
            vocab.pop(token["content"], None)
            token["content"] = TOKENS[token["id"]]
            vocab[token["content"]] = token["id"]
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = json.loads((source / "tokenizer_config.json").read_text())
    for key in ("is_local", "local_files_only"):  # of the folder it was saved from
        config.pop(key, None)
    config["extra_special_tokens"] = list(TOKENS.values())
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "chat_template.jinja").write_text(TEMPLATE)


def _weights(source: Path, folder: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    text = json.loads((source / "config.json").read_text())
    config = Idefics3Config(
        text_config=text,
        vision_config=VISION,
        scale_factor=2,
        image_token_id=3,
        tie_word_embeddings=True,
        pad_token_id=text["pad_token_id"],
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config)
    weights = load_file(source / "model.safetensors")
    state: dict[str, Any] = {
        f"model.text_model.{name.removeprefix('model.')}": tensor
        for name, tensor in weights.items()
        if name.startswith("model.")
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [name for name in missing if name.startswith("model.text_model.")], missing
    with torch.no_grad():
        connector = model.get_parameter(CONNECTOR)
        connector.normal_(0.0, 0.5 / connector.shape[1] ** 0.5)
    model.to(torch.bfloat16).save_pretrained(folder)


def _processor(folder: Path) -> None:
    from transformers import AutoTokenizer, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    images = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": 2 * TILE},
        max_image_size={"longest_edge": TILE},
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = Idefics3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=TEMPLATE,
    )
    processor.save_pretrained(folder)
    # transformers 5 keeps the image processor's settings inside processor_config.json;
    # vLLM (and AutoImageProcessor) read them from preprocessor_config.json.
    (folder / "preprocessor_config.json").write_text(json.dumps(images.to_dict(), indent=2))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
