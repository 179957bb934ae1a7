"""`settings.reasoning`: the reasoning keys, checked at start-up and never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sluicegate.settings import Settings, describe_error
from sluicegate.wire.reasoning_seal import MIN_KEY_BYTES


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_a_short_key_is_refused_without_being_echoed() -> None:
    with pytest.raises(ValidationError) as caught:
        settings(reasoning_key="too-short-secret")
    message = describe_error(caught.value)
    assert "SLUICEGATE_REASONING_KEY" in message and f"at least {MIN_KEY_BYTES}" in message
    assert "too-short-secret" not in message


def test_keys_from_files_and_lists(tmp_path: Path) -> None:
    current = tmp_path / "key"
    current.write_text("k" * MIN_KEY_BYTES + "\n")
    earlier = tmp_path / "earlier"
    earlier.write_text("a" * MIN_KEY_BYTES + "\n\n" + "b" * MIN_KEY_BYTES + "\n")
    loaded = settings(reasoning_key=f"@{current}", reasoning_previous_keys=f"@{earlier}")
    assert loaded.configured_reasoning_key() == b"k" * MIN_KEY_BYTES
    assert loaded.earlier_reasoning_keys() == (b"a" * MIN_KEY_BYTES, b"b" * MIN_KEY_BYTES)
    listed = settings(reasoning_previous_keys=f"{'a' * MIN_KEY_BYTES}, {'b' * MIN_KEY_BYTES}")
    assert listed.earlier_reasoning_keys() == (b"a" * MIN_KEY_BYTES, b"b" * MIN_KEY_BYTES)
    assert settings().configured_reasoning_key() is None


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read the key file"):
        settings(reasoning_key=f"@{tmp_path / 'absent'}")
    with pytest.raises(ValidationError, match="at least"):
        settings(reasoning_previous_keys="k" * MIN_KEY_BYTES + ",short")
