"""Run the test tiers one after another, and print how long each took at the end, so a growing
suite shows (docs/testing.md#tiers).

    python scripts/test_tiers.py unit integration [--workers 2] [--integration-workers 0]
        [-- pytest args...]

A tier runs in one or more lanes: pytest processes side by side, each over its own tests. The
unit tier is one lane over `--workers` pytest-xdist processes. The integration tier is two: the
modules that hold two engines at once or one beside another large process (`heavy`, in
tests/conftest.py), and every other; each lane's engines compute on a core of their own. A
lane's output is printed whole when it ends.

Every tier runs even when an earlier one fails; the exit status is the first failure's.
The failures' summary lines (pytest's `FAILED ...` and `ERROR ...`, each with its message's
first line) are printed again after the table, last, where a log cut in its middle keeps them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NO_TESTS = 5
"""pytest's exit status when a lane's selection (with `-k`, say) holds no test."""


@dataclass(frozen=True)
class Lane:
    name: str
    args: tuple[str, ...]


TIERS = {
    # Test functions spread over the workers; each worker starts its own Redis.
    "unit": (Lane("unit", ("-m", "unit", "--dist", "worksteal")),),
    # Whole files to one worker: a module's gateway (one engine each) starts once.
    "integration": (
        Lane("integration", ("-m", "integration and not heavy", "--dist", "loadfile")),
        Lane("integration, heavy", ("-m", "integration and heavy", "--dist", "loadfile")),
    ),
}


@dataclass
class Running:
    lane: Lane
    process: subprocess.Popen[bytes]
    output: Path
    started: float
    seconds: float = 0.0
    failures: tuple[str, ...] = ()


def start(lane: Lane, index: int, lanes: int, workers: str, extra: list[str]) -> Running:
    command = [sys.executable, "-m", "pytest", "-n", workers, *lane.args, *extra]
    print(f"== {lane.name}: {' '.join(command[1:])}", flush=True)
    output = Path(tempfile.mkstemp(prefix="sluicegate-lane-", suffix=".log")[1])
    env = {**os.environ}
    # Bytecode written once and read after: the lanes, the gateways they launch and their
    # spawned children each import the project (CI's environment sets this, for builds).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if lanes > 1:
        env["GATEWAY_TEST_LANE"] = f"{index}/{lanes}"  # tests/support/gateway.py
    with output.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    return Running(lane, process, output, time.monotonic())


SUMMARY_LINE_CHARS = 1500


def failure_lines(output: str) -> tuple[str, ...]:
    """pytest's short summary of what failed or errored, a line each, cut to
    `SUMMARY_LINE_CHARS`."""
    return tuple(
        line[:SUMMARY_LINE_CHARS]
        for line in output.splitlines()
        if line.startswith(("FAILED ", "ERROR "))
    )


def run_tier(name: str, workers: str, extra: list[str]) -> list[Running]:
    lanes = TIERS[name]
    running = [start(lane, i, len(lanes), workers, extra) for i, lane in enumerate(lanes)]
    pending = list(running)
    while pending:
        for lane in list(pending):
            if lane.process.poll() is None:
                continue
            pending.remove(lane)
            lane.seconds = time.monotonic() - lane.started
            print(f"\n== {lane.lane.name}: ended with {lane.process.returncode}", flush=True)
            text = lane.output.read_text(errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            lane.failures = failure_lines(text)
            lane.output.unlink()
        time.sleep(0.5)
    return running


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="+", choices=list(TIERS))
    parser.add_argument("--workers", default="2", help="pytest-xdist processes for the unit tier")
    parser.add_argument(
        "--integration-workers",
        default="0",
        help="pytest-xdist processes for each lane of the integration tier; 0, in the lane's "
        "own process, by default: engines are CPU-bound and hold about 4 GB each",
    )
    # What follows `--` goes to pytest as it is (argparse would read it as more tiers).
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]
    rows: list[tuple[str, str, int, float]] = []
    failures: list[str] = []
    for name in args.tiers:
        workers = args.integration_workers if name == "integration" else args.workers
        started = time.monotonic()
        lanes = run_tier(name, workers, extra)
        wall = time.monotonic() - started
        codes = [
            0 if lane.process.returncode == NO_TESTS else lane.process.returncode for lane in lanes
        ]
        rows += [
            (name, lane.lane.name, code, lane.seconds)
            for lane, code in zip(lanes, codes, strict=True)
        ]
        if len(lanes) > 1:
            rows.append((name, "(side by side)", next((c for c in codes if c), 0), wall))
        failures += [f"[{lane.lane.name}] {line}" for lane in lanes for line in lane.failures]
    print("\n| tier | lane | result | minutes |\n|---|---|---|---|")
    total = 0.0
    for name, lane, code, seconds in rows:
        print(f"| {name} | {lane} | {'passed' if code == 0 else f'failed ({code})'} | "
              f"{seconds / 60:.1f} |")  # fmt: skip
    for name in args.tiers:
        # A tier's wall time: its side-by-side row when it has lanes, else its one lane.
        tier_rows = [r for r in rows if r[0] == name]
        total += tier_rows[-1][3]
    print(f"| all | | | {total / 60:.1f} |", flush=True)
    if failures:
        print("\nfailures:", *failures, sep="\n", flush=True)
    return next((code for *_, code, _ in rows if code), 0)


if __name__ == "__main__":
    sys.exit(main())
