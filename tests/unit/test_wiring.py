"""`wiring`: each package's config object built from Settings."""

from __future__ import annotations

from pathlib import Path

from sluicegate import wiring
from sluicegate.settings import Settings


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_default_max_tokens_respects_max_tokens_limit() -> None:
    policy = wiring.budget_policy(settings(max_tokens_limit=100))
    assert (policy.default_max_tokens, policy.min_completion_tokens) == (100, 16)


def test_engine_config_carries_every_engine_setting(tmp_path: Path) -> None:
    config = wiring.engine_config(
        settings(max_model_len=2048, max_num_seqs=8, scheduling_policy="priority"), str(tmp_path)
    )
    assert (config.model, config.max_model_len, config.max_num_seqs) == (str(tmp_path), 2048, 8)
    assert config.scheduling_policy == "priority"
    assert config.served_model_name == "SmolLM2-135M-Instruct"


def test_rate_limit_overrides_become_limits() -> None:
    overrides = {"key-0123456789ab": {"requests_per_minute": 3}}
    limits = wiring.rate_limit_overrides(settings(rate_limit_overrides=overrides))
    assert limits["key-0123456789ab"].requests_per_minute == 3
    assert limits["key-0123456789ab"].tokens_per_minute is None
