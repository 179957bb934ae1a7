"""A profile from the JSON access log: the engine's requests only, in arrival order (a line's
time less its duration), their lengths from the usage, the rest filled in and said so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.tuning.access_log import profile_from_access_log
from sluicegate.tuning.profile import read_profile

START = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def access(
    ended: float,
    total_ms: float,
    path: str = "/v1/chat/completions",
    status: int = 200,
    cache: str | None = "MISS",
    prompt: int | None = 100,
    completion: int | None = 20,
) -> str:
    return json.dumps({
        "time": (START + timedelta(seconds=ended)).isoformat(timespec="milliseconds"),
        "level": "INFO",
        "logger": "sluicegate.access",
        "message": f"POST {path}",
        "status": status,
        "request_id": "r",
        "model": "m",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_ms": total_ms,
        "cache": cache,
    })  # fmt: skip


def test_the_engines_requests_in_arrival_order() -> None:
    lines = [
        access(10.0, 9000.0, prompt=300),  # arrived at 1 s
        access(3.0, 1000.0, "/v1/messages", prompt=50, completion=7),  # arrived at 2 s
        access(4.0, 10.0, cache="HIT"),  # no engine work
        access(5.0, 10.0, status=429, prompt=None, completion=None),
        access(6.0, 100.0, "/v1/embeddings"),
        access(2.5, 2000.0, "/v1/completions", cache="BYPASS", completion=0),  # at 0.5 s
        '{"time": "x", "logger": "vllm.engine", "message": "POST /v1/completions"}',
        "not json at all, with sluicegate.access in it",
    ]
    profile = profile_from_access_log(lines, max_model_len=2048)
    assert [r.t for r in profile.requests] == [0.0, 0.5, 1.5]
    assert [r.api for r in profile.requests] == ["completions", "chat", "messages"]
    assert [r.input_tokens for r in profile.requests] == [100, 300, 50]
    assert [r.output_tokens for r in profile.requests] == [0, 20, 7]
    assert all(r.blocks == () and r.finish_reason is None for r in profile.requests)
    assert profile.header["from"] == "access-log"


def test_profile_from_log_writes_what_tune_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("\n".join(access(i * 0.5 + 1, 800.0) for i in range(250)) + "\n")
    out = tmp_path / "profile.jsonl"
    assert main(["profile", "from-log", str(log), "-o", str(out)]) == 0
    assert len(read_profile(out).requests) == 250
    assert main(["profile", "check", str(out)]) == 0
    short = tmp_path / "short.log"
    short.write_text("\n".join(access(i, 10.0) for i in range(10)) + "\n")
    assert main(["profile", "from-log", str(short), "-o", str(tmp_path / "s.jsonl")]) == 2
    assert "10 engine requests" in capsys.readouterr().err
    assert main(["profile", "from-log", str(tmp_path / "none.log"), "-o", str(out)]) == 2
