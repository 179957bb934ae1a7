"""LoRA adapters made here, on the bundled model, with peft: nothing comes from a hub.

`make_adapters` loads the model once and saves one adapter per seed in PEFT's format
(`adapter_config.json`, `adapter_model.safetensors`): rank 8 on the attention projections,
weights drawn at random (`init_lora_weights=False`), the B matrices scaled down so that the
answers change but stay language."""

from __future__ import annotations

import json
from pathlib import Path

RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_adapters(folder: Path, seeds: dict[str, int], rank: int = RANK) -> dict[str, Path]:
    """One adapter per name, from its seed: `folder/<name>`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    base_dir = bundled_model_dir(Settings().model_cache_dir)
    made: dict[str, Path] = {}
    for name, seed in seeds.items():
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        config = LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False
        )
        model = get_peft_model(base, config)
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if "lora_B" in parameter_name:
                    parameter.mul_(0.3)
        out = folder / name
        model.save_pretrained(str(out))
        made[name] = out
    return made


def with_base_model(adapter: Path, copy: Path, base_model: str) -> Path:
    """A copy of `adapter` that says it was made for `base_model`."""
    copy.mkdir(parents=True, exist_ok=True)
    for path in adapter.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base_model
    (copy / "adapter_config.json").write_text(json.dumps(config))
    return copy
