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


def run_tier(name: str, workers: str, extra: list[str]) -> list[tuple[str, int, float]]:
    lanes = TIERS[name]
    running = [start(lane, i, len(lanes), workers, extra) for i, lane in enumerate(lanes)]
    results = []
    pending = list(running)
    while pending:
        for lane in list(pending):
            if lane.process.poll() is None:
                continue
            pending.remove(lane)
            lane.seconds = time.monotonic() - lane.started
            print(f"\n== {lane.lane.name}: ended with {lane.process.returncode}", flush=True)
            sys.stdout.write(lane.output.read_text(errors="replace"))
            sys.stdout.flush()
            lane.output.unlink()
        time.sleep(0.5)
    for lane in running:
        code = lane.process.returncode
        results.append((lane.lane.name, 0 if code == NO_TESTS else code, lane.seconds))
    return results


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
    for name in args.tiers:
        workers = args.integration_workers if name == "integration" else args.workers
        started = time.monotonic()
        lanes = run_tier(name, workers, extra)
        wall = time.monotonic() - started
        rows += [(name, lane, code, seconds) for lane, code, seconds in lanes]
        if len(lanes) > 1:
            rows.append((name, "(side by side)", next((c for _, c, _ in lanes if c), 0), wall))
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
    return next((code for *_, code, _ in rows if code), 0)


if __name__ == "__main__":
    sys.exit(main())
