"""`wiring.capture`: the capture's file is always new and its owner's alone, and a capture
that cannot be kept (a file there already, several workers) stops start-up in one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from sluicegate.cli import main
from sluicegate.settings import Settings, describe_error
from sluicegate.wiring.capture import CaptureFileError, check_capture_file, open_capture_file
from tests.support.gateway import free_port


def test_the_file_is_made_new_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    check_capture_file(path)
    previous = os.umask(0)
    try:
        with open_capture_file(path) as file:
            file.write(b"{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_file_or_link_is_refused_and_left_alone(tmp_path: Path) -> None:
    existing = tmp_path / "traffic.jsonl"
    existing.write_text("kept")
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    for path in (existing, link):
        with pytest.raises(CaptureFileError, match="exists; a capture is never appended to"):
            check_capture_file(path)
        with pytest.raises(CaptureFileError, match="SLUICEGATE_TRAFFIC_CAPTURE"):
            open_capture_file(path)
    assert existing.read_text() == "kept"
    assert not (tmp_path / "elsewhere.jsonl").exists()


def test_a_file_in_no_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CaptureFileError, match="no folder"):
        check_capture_file(tmp_path / "nowhere" / "traffic.jsonl")


def test_several_workers_cannot_capture() -> None:
    with pytest.raises(ValidationError) as several:
        Settings(  # type: ignore[call-arg]
            _env_file=None,
            workers=2,
            redis_url="redis://localhost:6379/0",
            traffic_capture="/tmp/traffic.jsonl",
        )
    message = describe_error(several.value)
    assert "traffic_capture cannot be used with workers=2" in message
    assert "its own arrival order" in message


@pytest.mark.parametrize("sample", ["-0.1", "1.5"])
def test_a_sample_outside_0_to_1_is_refused(sample: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(_env_file=None, traffic_capture_sample=sample)  # type: ignore[call-arg]
    assert "SLUICEGATE_TRAFFIC_CAPTURE_SAMPLE" in describe_error(refused.value)


def test_serve_refuses_an_existing_capture_file_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in [n for n in os.environ if n.startswith("SLUICEGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLUICEGATE_PORT", str(free_port()))
    # `serve` sets HF_HUB_OFFLINE for a local model: set and removed here, so that monkeypatch
    # puts back what was there before when the test ends.
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    path = tmp_path / "traffic.jsonl"
    path.write_text("kept")
    assert main(["serve", "--traffic-capture", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sluicegate: SLUICEGATE_TRAFFIC_CAPTURE: {path} exists")
    assert len(err.splitlines()) == 1
