from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from scripts import configuration_doc

from sluicegate.cli import build_parser, load_settings, main
from sluicegate.settings import Settings, describe_error
from tests.support.gateway import free_port


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in list(__import__("os").environ):
        if name.startswith("SLUICEGATE_"):
            monkeypatch.delenv(name)


def test_defaults_match_the_documented_table() -> None:
    s = Settings()
    assert (s.host, s.port, s.max_model_len) == ("127.0.0.1", 8000, 4096)
    assert (s.tensor_parallel_size, s.pipeline_parallel_size) == (1, 1)
    assert (s.data_parallel_size, s.distributed_executor_backend) == (1, None)
    assert s.gpu_memory_utilization == 0.9
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (256, 8192)
    assert s.long_prefill_token_threshold == 0
    assert s.enable_prefix_caching is True
    assert s.scheduling_policy == "fcfs"
    assert s.dtype == "auto"
    assert s.enforce_eager is None and s.cpu_kvcache_space_gib == 4
    assert s.model is None and s.model_name == "SmolLM2-135M-Instruct"


def test_environment_and_dotenv_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SLUICEGATE_PORT=9000\nSLUICEGATE_MAX_MODEL_LEN=1024\n")
    monkeypatch.setenv("SLUICEGATE_MAX_MODEL_LEN", "2048")
    s = Settings()
    assert s.port == 9000
    assert s.max_model_len == 2048  # the environment beats .env


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_PORT", "9000")
    monkeypatch.setenv("SLUICEGATE_ENABLE_PREFIX_CACHING", "true")
    args = vars(
        build_parser().parse_args(["serve", "--port", "9100", "--no-enable-prefix-caching"])
    )
    args.pop("command")
    s = load_settings(args)
    assert s.port == 9100
    assert s.enable_prefix_caching is False


def test_served_model_name_defaults_to_the_folder_name() -> None:
    assert Settings(model="/models/Llama-3-8B/").model_name == "Llama-3-8B"
    assert Settings(model="org/name", served_model_name="chat").model_name == "chat"


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("SLUICEGATE_PORT", "eighty", "SLUICEGATE_PORT"),
        ("SLUICEGATE_GPU_MEMORY_UTILIZATION", "1.5", "less than or equal to 1"),
        ("SLUICEGATE_SCHEDULING_POLICY", "random", "'fcfs' or 'priority'"),
        ("SLUICEGATE_DTYPE", "int3", "allowed"),
        ("SLUICEGATE_MAX_MODEL_LEN", "0", "SLUICEGATE_MAX_MODEL_LEN"),
        ("SLUICEGATE_DISTRIBUTED_EXECUTOR_BACKEND", "uni", "'mp' or 'ray'"),
        ("SLUICEGATE_DATA_PARALLEL_SIZE", "0", "SLUICEGATE_DATA_PARALLEL_SIZE"),
    ],
)
def test_bad_values_name_the_setting_and_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = describe_error(caught.value)
    assert env in message
    assert needle in message


def test_serve_with_a_bad_value_exits_2_with_one_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLUICEGATE_MAX_NUM_SEQS", "-3")
    with pytest.raises(SystemExit) as caught:
        main(["serve"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("sluicegate: invalid setting SLUICEGATE_MAX_NUM_SEQS")
    assert "Traceback" not in err


@pytest.fixture
def serve_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` takes its port before it looks at the model folder: a free one, not 8000 (which
    a gateway of the developer's, or the same test on another worker, may hold)."""
    monkeypatch.setenv("SLUICEGATE_PORT", str(free_port()))


@pytest.mark.usefixtures("serve_port")
def test_serve_with_a_missing_model_folder_fails_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"sluicegate: model folder {tmp_path / 'nope'} does not exist"


@pytest.mark.usefixtures("serve_port")
def test_serve_with_a_broken_model_folder_fails_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `serve` sets HF_HUB_OFFLINE for a local model: set, then removed, so that monkeypatch
    # puts back what was there before (nothing, or the caller's value) when the test ends.
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "config.json").write_text("{not json")
    assert main(["serve", "--model", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "unreadable config.json" in err and len(err.splitlines()) == 1


def test_configuration_page_is_the_one_make_docs_writes() -> None:
    current = configuration_doc.PAGE.read_text()
    assert current == configuration_doc.page(current), "docs/configuration.md is stale: make docs"
    for name in Settings.model_fields:
        assert f"`SLUICEGATE_{name.upper()}`" in current


def test_token_budget_defaults_and_refused_values(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.truncation, s.completion_truncation, s.max_tokens_overflow) == (
        "auto",
        "disabled",
        "clamp",
    )
    assert (s.budget_reserve_ratio, s.budget_default_max_tokens) == (0.3, 4096)
    assert s.budget_min_completion_tokens == 16
    monkeypatch.setenv("SLUICEGATE_BUDGET_RESERVE_RATIO", "1")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert "SLUICEGATE_BUDGET_RESERVE_RATIO" in describe_error(caught.value)
    monkeypatch.delenv("SLUICEGATE_BUDGET_RESERVE_RATIO")
    monkeypatch.setenv("SLUICEGATE_MAX_MODEL_LEN", "64")
    monkeypatch.setenv("SLUICEGATE_BUDGET_MIN_COMPLETION_TOKENS", "64")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert "budget_min_completion_tokens must be below max_model_len" in describe_error(
        caught.value
    )


def test_a_prefill_bound_past_the_context_window_is_refused_at_start() -> None:
    """vLLM would refuse it when the engine starts; the gateway says so first."""
    assert Settings(long_prefill_token_threshold=256).long_prefill_token_threshold == 256
    with pytest.raises(ValidationError) as caught:
        Settings(long_prefill_token_threshold=8192, max_model_len=4096)
    assert "long_prefill_token_threshold must be at most max_model_len" in describe_error(
        caught.value
    )
    with pytest.raises(ValidationError):
        Settings(long_prefill_token_threshold=-1)


def test_runtime_adapters_need_the_folders_they_may_come_from() -> None:
    with pytest.raises(ValidationError) as no_roots:
        Settings(allow_runtime_lora=True)
    assert "SLUICEGATE_LORA_ROOTS" in describe_error(no_roots.value)
    with pytest.raises(ValidationError) as relative:
        Settings(allow_runtime_lora=True, lora_roots="/adapters,adapters")
    assert "'adapters' is not an absolute path" in describe_error(relative.value)
    roots = Settings(allow_runtime_lora=True, lora_roots="/adapters, /mnt/adapters")
    assert roots.lora_root_folders == ("/adapters", "/mnt/adapters")
    # The operator's own adapters need none.
    assert Settings(lora_modules="a=/anywhere/a").lora_root_folders == ()


def test_several_workers_need_redis_and_no_runtime_adapters() -> None:
    with pytest.raises(ValidationError) as no_redis:
        Settings(workers=2)
    assert "SLUICEGATE_REDIS_URL" in describe_error(no_redis.value)
    with pytest.raises(ValidationError) as runtime_lora:
        Settings(workers=2, redis_url="redis://localhost:6379/0", allow_runtime_lora=True)
    assert "LORA_MODULES" in describe_error(runtime_lora.value)
    assert Settings(workers=2, redis_url="redis://localhost:6379/0").workers == 2
    assert Settings(allow_runtime_lora=True, lora_roots="/adapters").workers == 1


def test_several_workers_refuse_admission_bounds_changed_at_run_time() -> None:
    with pytest.raises(ValidationError) as several:
        Settings(workers=2, redis_url="redis://localhost:6379/0", allow_runtime_admission=True)
    assert "allow_runtime_admission cannot be used with workers=2" in describe_error(several.value)
    assert "each worker holds its own admission bounds" in describe_error(several.value)
    assert Settings(allow_runtime_admission=True).allow_runtime_admission
    assert not Settings().allow_runtime_admission
