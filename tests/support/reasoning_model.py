"""A reasoning variant of the bundled model, made here from its folder: nothing comes from a hub.

SmolLM2 does not think, so the variant is taught to, just enough for tests: the spare added
token id 15 (`<jupyter_script>`) becomes `</think>` (not special, so detokenizing keeps its
text, which vLLM's `step3` parser reads), and its embedding row becomes a slightly scaled copy
of the row of "." (id 30): the tied output head then prefers `</think>` where the model would
end a sentence, so its first sentence is a thought and the rest the answer. The chat template
opens a think block in the generation prompt (`<think>\\n` as plain text), writes an empty
closed block when `enable_thinking` is false, and renders earlier thoughts as plain text
(never `</think>`: `step3` takes any `</think>` in the prompt as thoughts already ended).

Checked by hand (greedy, 48 tokens): "Tell me about Paris." gives "Paris is a city that has
captivated the imagination of people from all over the world", `</think>`, then an answer of
several sentences (in which the model writes more `</think>` where it would write "."); "What
is the capital of France?" gives a one-sentence thought, `</think>` and no answer, which is why
the tests ask the former.

`reasoning_tokenizer` makes a folder with the tokenizer alone (no weights), optionally with
id 14 as `<think>` too, for parsers that need both markers (`deepseek_r1`).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from tests.support.derived_model import derived_model

END_ID = 15
START_ID = 14
PERIOD_ID = 30
SCALE = 1.1
PARSER = "step3"
TEMPLATE_FILE = "reasoning.jinja"
RECIPE = "reasoning-v1"
"""Changes when the recipe does: a folder made by another is made again."""
MARKER = ".sluicegate-reasoning-ready"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")


def reasoning_template() -> str:
    """The shipped tool template with a think block opened in the generation prompt."""
    from sluicegate.engine.model import shipped_template

    text = shipped_template()
    content = "{%- set content = message['content'] if message['content'] is not none else '' -%}"
    thought = (
        content + "\n{%- set thought = message['reasoning'] if message['reasoning'] is defined "
        "and message['reasoning'] else '' -%}\n"
        "{%- if message['role'] == 'assistant' and thought -%}\n"
        "{%- set content = '(thinking: ' + thought + ')\\n' + content -%}\n"
        "{%- endif -%}"
    )
    prompt = "{{- '<|im_start|>assistant\\n' -}}"
    thinking = (
        "{%- if enable_thinking is defined and enable_thinking is false -%}\n"
        "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}\n"
        "{%- else -%}\n"
        "{{- '<|im_start|>assistant\\n<think>\\n' -}}\n"
        "{%- endif -%}"
    )
    assert text.count(content) == 1 and text.count(prompt) == 1, "the shipped template changed"
    return text.replace(content, thought).replace(prompt, thinking)


def reasoning_model(folder: Path | None = None) -> Path:
    """The variant with weights (about 540 MB), made once beside the bundled model (or in
    `folder`)."""
    return derived_model("reasoning", RECIPE, MARKER, _build, folder)


def _build(source: Path, folder: Path) -> None:
    from sluicegate.engine.model import READY_MARKER

    shutil.copytree(source, folder)
    (folder / READY_MARKER).unlink(missing_ok=True)
    _rename_tokens(folder, {END_ID: "</think>"})
    _copy_row(folder / "model.safetensors", "model.embed_tokens.weight", PERIOD_ID, END_ID)
    (folder / TEMPLATE_FILE).write_text(reasoning_template())
    (folder / "chat_template.jinja").write_text(reasoning_template())


def reasoning_tokenizer(folder: Path, with_start: bool = False) -> Path:
    """The variant's tokenizer alone in `folder` (with `<think>` as id 14 if `with_start`)."""
    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    source = bundled_model_dir(Settings().model_cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    names = {END_ID: "</think>", **({START_ID: "<think>"} if with_start else {})}
    _rename_tokens(folder, names)
    (folder / "chat_template.jinja").write_text(reasoning_template())
    return folder


def _rename_tokens(folder: Path, names: dict[int, str]) -> None:
    """Give added tokens new texts, as ordinary (not special) tokens."""
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    for token in data["added_tokens"]:
        if token["id"] in names:
            del vocab[token["content"]]
            token["content"] = names[token["id"]]
            token["special"] = False
            vocab[token["content"]] = token["id"]
    path.write_text(json.dumps(data, ensure_ascii=False))


def _copy_row(path: Path, tensor: str, source: int, target: int) -> None:
    """Row `target` of a float32 matrix in a safetensors file becomes row `source` times
    `SCALE`, written in place (the file is a copy)."""
    with path.open("r+b") as file:
        (header_size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_size))
        info = header[tensor]
        assert info["dtype"] == "F32", info["dtype"]
        width = info["shape"][1]
        start = 8 + header_size + info["data_offsets"][0]
        file.seek(start + source * width * 4)
        row = struct.unpack(f"<{width}f", file.read(width * 4))
        file.seek(start + target * width * 4)
        file.write(struct.pack(f"<{width}f", *(value * SCALE for value in row)))
