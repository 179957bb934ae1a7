"""`LORA_MODULES` in vLLM's forms, and what is checked of an adapter before vLLM loads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from sluicegate.engine.lora import (
    AdapterError,
    BaseModel,
    LoraModule,
    parse_lora_modules,
    parse_lora_roots,
    read_adapter,
)

# The bundled model's sizes (SmolLM2-135M): hidden 576, 9 heads of 64, 3 key/value heads.
SMOL = {
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
}
BASE = BaseModel.of({"SmolLM2-135M-Instruct", "smol"}, SMOL)


def adapter(
    tmp_path: Path,
    rank: int = 8,
    hidden: int = 576,
    kv: int = 192,
    config: dict[str, Any] | None = None,
    weights: bool = True,
) -> str:
    """A PEFT-shaped adapter folder: q_proj and v_proj of one layer, at `rank`."""
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    settings = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "/root/.cache/sluicegate/models/SmolLM2-135M-Instruct",
        **(config or {}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    if weights:
        layer = "base_model.model.model.layers.0.self_attn"
        tensors = {
            f"{layer}.q_proj.lora_A.weight": np.zeros((rank, hidden), np.float32),
            f"{layer}.q_proj.lora_B.weight": np.zeros((hidden, rank), np.float32),
            f"{layer}.v_proj.lora_A.weight": np.zeros((rank, hidden), np.float32),
            f"{layer}.v_proj.lora_B.weight": np.zeros((kv, rank), np.float32),
        }
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return str(folder)


def test_name_path_pairs_and_json_are_read_as_vllm_reads_them() -> None:
    assert parse_lora_modules("a=/x/a, b=/x/b") == [
        LoraModule("a", "/x/a"),
        LoraModule("b", "/x/b"),
    ]
    assert parse_lora_modules('{"name": "a", "path": "/x/a", "base_model_name": "m"}') == [
        LoraModule("a", "/x/a", "m")
    ]
    assert parse_lora_modules('[{"name": "a", "path": "/x/a"}, {"name": "b", "path": "/b"}]') == [
        LoraModule("a", "/x/a"),
        LoraModule("b", "/b"),
    ]
    assert parse_lora_modules("  ") == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a", "'a' is not name=path"),
        ("a=/x,=b", "'=b' is not name=path"),
        ("a=/x,a=/y", "names the adapter 'a' twice"),
        ("[{", "not valid JSON"),
        ('[{"name": "a"}]', "needs a name and a path"),
        ('[{"name": "a", "path": "/x", "rank": 8}]', "unknown fields: ['rank']"),
        ("[1]", "objects with name and path"),
        ('{"name": "bell\\u0007", "path": "/x"}', "entry 'bell\\x07'"),
        ('{"name": "/abs", "path": "/x"}', "not starting with '/'"),
        (f"{'n' * 257}=/x", "1 to 256 characters"),
    ],
)
def test_a_malformed_list_is_refused_saying_where(value: str, says: str) -> None:
    with pytest.raises(AdapterError) as caught:
        parse_lora_modules(value)
    assert says in str(caught.value)


def test_a_good_adapter_passes_with_its_rank(tmp_path: Path) -> None:
    info = read_adapter(adapter(tmp_path), 16, BASE)
    assert info.rank == 8 and info.base_model is not None and len(info.fingerprint) == 32


def test_the_fingerprint_changes_when_the_adapter_is_replaced_in_place(tmp_path: Path) -> None:
    first = read_adapter(adapter(tmp_path, rank=8), 16, BASE).fingerprint
    second = read_adapter(adapter(tmp_path, rank=16), 16, BASE).fingerprint
    assert first != second


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: str(p / "missing"), "no adapter folder at"),
        (lambda p: "relative/path", "is not an absolute path"),
        (lambda p: str(p), "holds no adapter_config.json: not a PEFT adapter"),
        (lambda p: adapter(p, rank=32), "rank 32 is over the engine's max_lora_rank 16"),
        (
            lambda p: adapter(p, config={"rank_pattern": {"q_proj": 64}}),
            "rank 64 is over the engine's max_lora_rank 16",
        ),
        (
            lambda p: adapter(p, config={"base_model_name_or_path": "meta-llama/Llama-3.1-8B"}),
            "made for the base model 'meta-llama/Llama-3.1-8B', not for this engine's",
        ),
        (lambda p: adapter(p, hidden=4096), "does not fit this engine's base model"),
        (lambda p: adapter(p, kv=100), "has size 100"),
        (lambda p: adapter(p, weights=False), "holds no adapter weights"),
        (lambda p: adapter(p, config={"peft_type": "IA3"}), "is not a LoRA adapter"),
        (lambda p: adapter(p, config={"r": 0}), "rank r must be a positive integer"),
    ],
)
def test_an_adapter_that_cannot_work_is_refused_saying_why(
    tmp_path: Path, make: Any, says: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(AdapterError) as caught:
        read_adapter(path, 16, BASE)
    assert says in str(caught.value)


def test_a_base_model_named_by_its_hub_id_matches_the_folder(tmp_path: Path) -> None:
    config = {"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    assert read_adapter(adapter(tmp_path, config=config), 16, BASE).rank == 8


def test_a_broken_weights_file_is_refused(tmp_path: Path) -> None:
    path = adapter(tmp_path)
    (Path(path) / "adapter_model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(AdapterError, match="is not a safetensors file"):
        read_adapter(path, 16, BASE)


def test_roots_are_absolute_folders_separated_by_commas() -> None:
    assert parse_lora_roots(" /adapters, /mnt/more/ ,") == ("/adapters", "/mnt/more/")
    assert parse_lora_roots("") == ()
    with pytest.raises(AdapterError, match="'adapters' is not an absolute path"):
        parse_lora_roots("/ok,adapters")
