"""`sluicegate profile`: make, check and export, and a bad profile's exit code 2 naming the
line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.cli import main


def test_make_check_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "chat.jsonl"
    assert main(["profile", "make", "chat", "-o", str(profile), "--requests", "250"]) == 0
    assert main(["profile", "check", str(profile)]) == 0
    assert "250 engine requests" in capsys.readouterr().out
    trace = tmp_path / "trace.jsonl"
    assert main(["profile", "export", str(profile), "--timed-trace", str(trace)]) == 0
    assert len(trace.read_text().splitlines()) == 250
    assert "vllm bench serve" in capsys.readouterr().out


def test_a_bad_profile_exits_2_naming_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "chat.jsonl"
    assert main(["profile", "make", "chat", "-o", str(profile), "--requests", "250"]) == 0
    lines = profile.read_text().splitlines()
    broken = json.loads(lines[5])
    broken["output_tokens"] = "many"
    lines[5] = json.dumps(broken)
    profile.write_text("\n".join(lines))
    capsys.readouterr()
    assert main(["profile", "check", str(profile)]) == 2
    assert "line 6: output_tokens: " in capsys.readouterr().err
    assert main(["profile", "check", str(tmp_path / "none.jsonl")]) == 2


@pytest.mark.parametrize("flags", [["--requests", "10"], ["--rate", "nan"], ["--rate", "0"]])
def test_make_refuses_what_cannot_be_tuned_on(tmp_path: Path, flags: list[str]) -> None:
    assert main(["profile", "make", "chat", "-o", str(tmp_path / "p.jsonl"), *flags]) == 2
    assert not (tmp_path / "p.jsonl").exists()
