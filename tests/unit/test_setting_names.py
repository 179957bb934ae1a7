"""`setting_names`: the `SLUICEGATE_*` names given that are no setting (what `serve` does with
them is tests/unit/test_cli.py), and a look through the repository for any it sets itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from sluicegate.setting_names import UnknownSetting, closest, unknown_settings
from sluicegate.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"\bSLUICEGATE_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]*\*)")
_ON_PURPOSE = {
    "tests/unit/test_cli.py",
    "tests/unit/test_setting_names.py",
    "docs/configuration.md",
}
"""Tests that give unknown names to see them refused, and the page that shows the refusal."""


def test_names_of_the_environment_and_of_dotenv_that_are_no_setting(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("SLUICEGATE_PORT=9000\nsluicegate_redis=redis://r\nOTHER=1\n")
    environ = {"SLUICEGATE_MAX_WAITING": "4", "SLUICEGATE_HOST": "::", "PATH": "/bin"}
    assert unknown_settings(environ, dotenv) == [
        UnknownSetting(
            "SLUICEGATE_MAX_WAITING", "the environment", ENV_PREFIX + "MAX_ENGINE_WAITING"
        ),
        UnknownSetting("SLUICEGATE_REDIS", str(dotenv), ENV_PREFIX + "REDIS_URL"),
    ]
    assert unknown_settings({}, tmp_path / "missing.env") == []


def test_the_closest_setting_is_named_only_when_one_is_alike() -> None:
    assert closest("SLUICEGATE_PROT") == "SLUICEGATE_PORT"
    assert closest("SLUICEGATE_API_KEY") == "SLUICEGATE_API_KEYS"
    assert closest("SLUICEGATE_ZZZ") is None
    assert str(UnknownSetting("SLUICEGATE_ZZZ", ".env", None)) == (
        "unknown setting SLUICEGATE_ZZZ in .env"
    )


def test_the_repository_sets_no_sluicegate_variable_that_is_no_setting() -> None:
    """Compose files, manifests, Dockerfiles, scripts, docs and tests name real settings only
    (a `SLUICEGATE_UPSTREAM_*` family is not a name): a gateway started with one of theirs
    would refuse to start."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found: dict[str, set[str]] = {}
    for name in files:
        path = ROOT / name
        if name in _ON_PURPOSE or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for match in _NAME.findall(text):
            if match not in known:
                found.setdefault(name, set()).add(match)
    assert found == {}
