"""The files a tune leaves: `recommended.env` loads back through the gateway's own settings
loader, `trials.csv` reads back a row per run (a knob's column empty where the run kept
today's value, an infinite TTFT as `inf`), the report ends with its verdict and says `none`
for a time never measured."""

from __future__ import annotations

import csv
import importlib.metadata
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluicegate.cli import load_settings
from sluicegate.tuning.objective import Objective, Score
from sluicegate.tuning.outputs import (
    Row,
    env_lines,
    machine_info,
    row_of,
    write_recommended_env,
    write_report,
    write_trials_csv,
)
from sluicegate.tuning.search import Config, Trial

SCORE = Score(3.5, 0.95, 0.4, 0.9, 1.7, 0.05, 250.0, 1, 0, 38, 40)
WEAK = Score(2.0, 0.6, 1.5, 2.6, 4.0, 0.12, 180.0, 0, 2, 24, 40)
SILENT = Score(0.0, 0.0, math.inf, math.inf, math.inf, 0.0, 0.0, 0, 12, 0, 12)
"""Nothing answered."""
TODAY = Config()
BEST = Config.of({"max_num_seqs": 32, "enable_prefix_caching": False})
OTHER = Config.of({"gpu_memory_utilization": 0.85})
OBJECTIVE = Objective(ttft=2.0, itl=0.3)
MACHINE = {"cpu": "Test CPU", "cores": "2", "python": "3.11", "vllm": "0.0", "sluicegate": "0.1"}
VERDICT = "Recommended: max_num_seqs=32 enable_prefix_caching=False (1.18x today's goodput)."


def _rows() -> list[Row]:
    return [
        Row("search", 0, 0, "trial", TODAY, 20.0, 40, WEAK),
        Row("search", 0, 0, "trial", BEST, 20.0, 40, SCORE),
        Row("search", 0, 0, "trial", OTHER, 20.0, 40, SILENT, stopped_early=True),
        Row("search", 1, 0, "trial", BEST, 40.0, 80, SCORE),
        Row("confirm", -1, 0, "today", TODAY, 60.0, 120, SILENT),
        Row("confirm", -1, 0, "candidate", BEST, 60.0, 120, SCORE),
        Row("confirm", -1, 1, "candidate", BEST, 60.0, 120, SCORE),
        Row("confirm", -1, 1, "today", TODAY, 60.0, 120, SILENT),
    ]


def test_env_lines_spell_each_knob_as_the_environment_does() -> None:
    config = Config.of(
        {
            "max_num_seqs": 32,
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.85,
            "scheduling_policy": "priority",
        }
    )
    assert env_lines(config) == [
        "SLUICEGATE_ENABLE_PREFIX_CACHING=false",
        "SLUICEGATE_GPU_MEMORY_UTILIZATION=0.85",
        "SLUICEGATE_MAX_NUM_SEQS=32",
        "SLUICEGATE_SCHEDULING_POLICY=priority",
    ]


def test_a_knob_that_is_no_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="'max_num_seq' is not a setting"):
        env_lines(Config.of({"max_num_seq": 32}))


@pytest.mark.parametrize("value", ["two words", "x\nSLUICEGATE_API_KEYS=k", math.nan, None, [1]])
def test_a_value_an_env_file_cannot_hold_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"^scheduling_policy: "):
        env_lines(Config.of({"scheduling_policy": value}))


def test_recommended_env_loads_back_through_the_settings_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("SLUICEGATE_"):
            monkeypatch.delenv(name)
    config = Config.of(
        {
            "max_num_seqs": 32,
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 0.85,
            "scheduling_policy": "priority",
        }
    )
    write_recommended_env(tmp_path / ".env", config, "objective: ttft_p90=2s\nratio 1.18")
    lines = (tmp_path / ".env").read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["# objective: ttft_p90=2s", "# ratio 1.18"]
    settings = load_settings({})  # exits on a name that is no setting
    assert settings.max_num_seqs == 32
    assert settings.enable_prefix_caching is False
    assert settings.gpu_memory_utilization == 0.85
    assert settings.scheduling_policy == "priority"


def test_trials_csv_reads_back_a_row_per_run(tmp_path: Path) -> None:
    rows = _rows()
    write_trials_csv(tmp_path / "trials.csv", rows, MACHINE)
    with (tmp_path / "trials.csv").open(encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        read = list(reader)
        columns = reader.fieldnames
    assert columns is not None
    assert columns[:7] == [
        "stage", "rung", "round", "arm",
        "enable_prefix_caching", "gpu_memory_utilization", "max_num_seqs",
    ]  # fmt: skip
    assert columns[-5:] == list(MACHINE)
    assert len(read) == len(rows)
    today, best, silent = read[0], read[1], read[2]
    assert [today[k] for k in columns[4:7]] == ["", "", ""]
    assert [best[k] for k in columns[4:7]] == ["false", "", "32"]
    assert silent["gpu_memory_utilization"] == "0.85" and silent["stopped_early"] == "true"
    assert silent["ttft_p90"] == "inf" and float(silent["ttft_p99"]) == math.inf
    assert float(best["ttft_p90"]) == 0.9 and float(best["offered_rps"]) == 2.0
    assert read[4]["stage"] == "confirm" and read[4]["rung"] == "-1" and read[4]["arm"] == "today"
    assert read[6]["round"] == "1" and read[6]["arm"] == "candidate"
    assert all(r["cpu"] == "Test CPU" and r["cores"] == "2" for r in read)


def test_a_machine_column_that_repeats_a_column_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repeat"):
        write_trials_csv(tmp_path / "trials.csv", _rows(), {"goodput": "x"})


def test_machine_info_reads_versions_without_importing_vllm() -> None:
    script = (
        "import sys\nfrom sluicegate.tuning.outputs import machine_info\n"
        "info = machine_info()\nprint('vllm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    info = machine_info()
    assert set(info) == {"cpu", "cores", "python", "vllm", "sluicegate"}
    assert info["python"] == platform.python_version()
    assert info["sluicegate"] == importlib.metadata.version("sluicegate")
    assert int(info["cores"]) >= 1 and info["cpu"]


def test_a_search_trial_becomes_a_row() -> None:
    row = row_of(Trial(BEST, 2, SCORE, 95.0, stopped_early=True), 80.0, 160)
    assert row == Row("search", 2, 0, "trial", BEST, 80.0, 160, SCORE, stopped_early=True)
    with pytest.raises(ValueError, match="stage"):
        Row("replay", 0, 0, "trial", BEST, 80.0, 160, SCORE)


def _report(path: Path, **changes: Any) -> list[str]:
    """The report's lines, of `_rows()` with a confirmation that recommends, unless changed."""
    given: dict[str, Any] = {
        "profile_summary": "chat.jsonl: 400 requests over 200 s",
        "objective": OBJECTIVE,
        "rows": _rows(),
        "today": TODAY,
        "recommended": BEST,
        "ratio": 1.18,
        "lower_bound": 1.07,
        "verdict": VERDICT,
        "minutes": 42.0,
    }
    write_report(path, **{**given, **changes})
    return path.read_text(encoding="utf-8").splitlines()


def test_the_report_ends_with_the_verdict_and_says_none_for_no_answer(tmp_path: Path) -> None:
    lines = _report(tmp_path / "report.md")
    text = "\n".join(lines)
    assert lines[-1] == VERDICT
    assert "chat.jsonl: 400 requests over 200 s" in text
    assert "P90 TTFT within 2.00 s" in text and "ITL within 300 ms" in text
    assert "4 search trials over 2 windows, 4 confirmation runs" in text
    search = next(line for line in lines if line.startswith("| search"))
    assert "window 1" in search and "max_num_seqs=32" in search and "900 ms" in search
    today = next(line for line in lines if line.startswith("| confirm, today"))
    assert today.endswith("| none | none |")
    assert "2 pairs" in text and "1.180×" in text and "1.070×" in text
    assert "`recommended.env`: the recommended settings" in text


def test_a_report_without_a_confirmation_says_so(tmp_path: Path) -> None:
    lines = _report(
        tmp_path / "report.md",
        rows=[r for r in _rows() if r.stage == "search"],
        recommended=None,
        ratio=None,
        lower_bound=None,
        verdict="Keep today's settings:\nnothing met the objective.",
    )
    assert lines[-1] == "Keep today's settings: nothing met the objective."
    text = "\n".join(lines)
    assert "Not run" in text and "no setting to change" in text
