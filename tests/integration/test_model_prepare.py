"""`sluicegate model prepare` converts the bundled GGUF for real (about 20 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sluicegate.engine.model import EXPECTED_EOS, READY_MARKER


def prepare(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluicegate",
            "model",
            "prepare",
            "--model-cache-dir",
            str(cache_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_prepare_converts_once_and_checks_the_result(tmp_path: Path) -> None:
    first = prepare(tmp_path)
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip())
    assert folder == tmp_path / "SmolLM2-135M-Instruct"
    assert (folder / READY_MARKER).exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config.get("eos_token") == EXPECTED_EOS
    assert not list(tmp_path.glob("*.partial"))

    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    again = prepare(tmp_path)
    assert again.returncode == 0 and Path(again.stdout.strip()) == folder
    assert weights.stat().st_mtime_ns == written, "a prepared model is not converted again"
