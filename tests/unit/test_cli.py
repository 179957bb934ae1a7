"""`cli`: what `serve` does before the server starts, in each mode."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sluicegate import server
from sluicegate.cli import main
from sluicegate.engine import model
from sluicegate.settings import Settings
from tests.support.gateway import free_port

UPSTREAM = "http://127.0.0.1:9/v1"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No stray `.env` or `SLUICEGATE_*`, no `HF_HUB_OFFLINE`; an empty model cache."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("SLUICEGATE_"):
            monkeypatch.delenv(name)
    # Set, then removed: monkeypatch restores only what it changed, and `serve` sets
    # `HF_HUB_OFFLINE` itself (a local model), which must not outlive the test.
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    cache = tmp_path / "models"
    monkeypatch.setenv("SLUICEGATE_MODEL_CACHE_DIR", str(cache))
    monkeypatch.setenv("SLUICEGATE_PORT", str(free_port()))  # `serve` takes it first
    return cache


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """The settings `serve` would have run the server with (it runs none)."""
    runs: list[Settings] = []

    def serve(settings: Settings, sock: object = None) -> int:
        runs.append(settings)
        return 0

    monkeypatch.setattr(server, "serve", serve)
    return runs


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The model caches `serve` prepared the bundled model in (it converts nothing)."""
    caches: list[Path] = []

    def prepare(cache_dir: Path, force: bool = False) -> Path:
        caches.append(cache_dir)
        return model.bundled_model_dir(cache_dir)

    monkeypatch.setattr(model, "prepare_bundled_model", prepare)
    monkeypatch.setattr(model, "resolve_model", lambda name, cache_dir: "folder")
    return caches


def test_upstream_mode_prepares_no_model_and_leaves_the_hub_online(
    monkeypatch: pytest.MonkeyPatch,
    clean_env: Path,
    served: list[Settings],
    prepared: list[Path],
) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("SLUICEGATE_TOKENIZER", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert main(["serve"]) == 0
    assert len(served) == 1
    assert prepared == []
    assert not clean_env.exists()
    # A hub tokenizer id resolves where the hub is reachable.
    assert "HF_HUB_OFFLINE" not in os.environ


def test_upstream_mode_keeps_an_offline_hub_asked_for(
    monkeypatch: pytest.MonkeyPatch, served: list[Settings], prepared: list[Path]
) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["serve"]) == 0
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_the_bundled_model_is_prepared_with_the_hub_offline(
    clean_env: Path, served: list[Settings], prepared: list[Path]
) -> None:
    assert main(["serve"]) == 0
    assert prepared == [clean_env]
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert len(served) == 1


def test_an_engine_hub_model_leaves_the_hub_online(
    monkeypatch: pytest.MonkeyPatch, served: list[Settings], prepared: list[Path]
) -> None:
    monkeypatch.setenv("SLUICEGATE_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert main(["serve"]) == 0
    assert prepared == []
    assert "HF_HUB_OFFLINE" not in os.environ


def test_a_tokenizer_without_transformers_stops_serve_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[Settings],
    prepared: list[Path],
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("SLUICEGATE_TOKENIZER", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert main(["serve"]) == 1
    assert "pip install 'sluicegate[tokenizer]'" in capsys.readouterr().err
    assert served == []


def test_upstream_mode_without_a_tokenizer_needs_no_transformers(
    monkeypatch: pytest.MonkeyPatch, served: list[Settings], prepared: list[Path]
) -> None:
    for name in ("transformers", "vllm", "torch"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    assert main(["serve"]) == 0
    assert len(served) == 1 and prepared == []


def test_engine_mode_without_vllm_stops_serve_naming_the_extras(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[Settings],
    prepared: list[Path],
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert main(["serve"]) == 1
    error = capsys.readouterr().err
    assert "sluicegate[cpu]" in error and "SLUICEGATE_UPSTREAM_URLS" in error
    assert served == [] and prepared == []


def test_serve_help_lists_every_setting_and_survives_a_percent_sign(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "20% more load" in text  # UPSTREAM_RETRY_BUDGET's description
    assert all(f"--{name.replace('_', '-')}" in text for name in Settings.model_fields)


def test_a_bad_models_file_stops_serve_naming_the_entry(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    served: list[Settings],
    prepared: list[Path],
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  - {name: a, fallbacks: [b], upstreams: [{url: 'http://h/v1'}]}\n"
        "  - {name: b, fallbacks: [a], upstreams: [{url: 'http://g/v1'}]}\n"
    )
    monkeypatch.setenv("SLUICEGATE_MODELS_FILE", str(models))
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert f"{models}, model 'a': its fallbacks lead back to it (a -> b -> a)" in err
    assert served == [] and prepared == []


def test_a_models_file_of_pools_prepares_no_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, served: list[Settings], prepared: list[Path]
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: a, upstreams: [{url: 'http://h/v1'}]}\n")
    monkeypatch.setenv("SLUICEGATE_MODELS_FILE", str(models))
    assert main(["serve"]) == 0
    assert prepared == [] and len(served) == 1
    assert "HF_HUB_OFFLINE" not in os.environ


def test_a_models_file_with_the_local_engine_prepares_its_model(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    clean_env: Path,
    served: list[Settings],
    prepared: list[Path],
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  - {name: smol, engine: local}\n  - {name: a, upstreams: [{url: 'http://h/v1'}]}\n"
    )
    monkeypatch.setenv("SLUICEGATE_MODELS_FILE", str(models))
    assert main(["serve"]) == 0
    assert prepared == [clean_env]


def test_adapters_without_the_local_engine_stop_serve(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    served: list[Settings],
    prepared: list[Path],
) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("SLUICEGATE_LORA_MODULES", "ad1=/adapters/ad1")
    assert main(["serve"]) == 1
    assert "LORA_MODULES needs the in-process engine" in capsys.readouterr().err
    assert served == []


def test_an_unknown_setting_stops_serve_naming_it_and_the_closest_one(
    monkeypatch: pytest.MonkeyPatch,
    served: list[Settings],
    prepared: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("SLUICEGATE_MAX_WAITING", "4")  # MAX_ENGINE_WAITING, mistyped
    with pytest.raises(SystemExit) as stopped:
        main(["serve"])
    assert stopped.value.code == 2
    assert served == [] and prepared == []  # stopped before anything started
    err = capsys.readouterr().err
    assert "SLUICEGATE_MAX_WAITING" in err
    assert "did you mean SLUICEGATE_MAX_ENGINE_WAITING?" in err


def test_an_unknown_key_of_the_dotenv_file_stops_serve(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    served: list[Settings],
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / ".env").write_text(f"SLUICEGATE_UPSTREAM_URLS={UPSTREAM}\nSLUICEGATE_PROT=9000\n")
    with pytest.raises(SystemExit):
        main(["serve"])
    assert served == []
    err = capsys.readouterr().err
    assert "SLUICEGATE_PROT in .env" in err and "SLUICEGATE_PORT" in err


def test_an_unknown_setting_is_reported_beside_a_bad_value(
    monkeypatch: pytest.MonkeyPatch, served: list[Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLUICEGATE_PORT", "eighty")
    monkeypatch.setenv("SLUICEGATE_HOTS", "0.0.0.0")
    with pytest.raises(SystemExit):
        main(["serve"])
    err = capsys.readouterr().err
    assert "SLUICEGATE_PORT='eighty'" in err and "SLUICEGATE_HOTS" in err


@pytest.mark.parametrize("allow", [["--allow-unknown-settings"], []], ids=["flag", "environment"])
def test_allowing_unknown_settings_turns_the_error_into_a_warning(
    monkeypatch: pytest.MonkeyPatch,
    served: list[Settings],
    capsys: pytest.CaptureFixture[str],
    allow: list[str],
) -> None:
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", UPSTREAM)
    monkeypatch.setenv("SLUICEGATE_MAX_WAITING", "4")
    if not allow:
        monkeypatch.setenv("SLUICEGATE_ALLOW_UNKNOWN_SETTINGS", "true")
    assert main(["serve", *allow]) == 0
    assert len(served) == 1
    assert "warning: unknown setting SLUICEGATE_MAX_WAITING" in capsys.readouterr().err
