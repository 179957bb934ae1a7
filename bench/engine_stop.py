"""How long a stop takes: sluicegate against vLLM's own server, on the same model and flags,
started and stopped in turn (SIGTERM to an idle server, timed to its exit).

Each round starts every target, waits until it is ready, sends SIGTERM to it alone and times
its exit; the targets take turns, their order rotating from round to round, so the machine's
drift falls on all alike. For sluicegate the engines' part is read from its log too: from
"shutting down the engines" to uvicorn's "Application shutdown complete". With
`--baseline-src DIR` a second sluicegate runs from another tree's `src/` (an earlier commit
checked out or archived there), to compare a change with what it changes.

    .venv/bin/python bench/engine_stop.py --rounds 4
    .venv/bin/python bench/engine_stop.py --rounds 4 --baseline-src /tmp/old/src
    .venv/bin/python bench/engine_stop.py --rounds 4 --busy 6   # with 6 busy loops running
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

from compare_vllm import RESULTS, machine, parse_args, publish, start

ENGINES_FROM = "sluicegate.app: shutting down the engines"
ENGINES_TO = "Application shutdown complete"


def stamp(line: str) -> float | None:
    """The time of one of sluicegate's log lines (`2026-12-07 09:06:36,875 INFO ...`)."""
    try:
        when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return when.timestamp()


def engines_part(log: str) -> float | None:
    """Seconds from the gateway's "shutting down the engines" to "Application shutdown
    complete", or None when the log lacks either."""
    begun = ended = None
    for line in log.splitlines():
        if ENGINES_FROM in line:
            begun = stamp(line)
        elif ENGINES_TO in line and begun is not None:
            ended = stamp(line)
    if begun is None or ended is None:
        return None
    return ended - begun


def stop_once(
    kind: str, label: str, args: argparse.Namespace, round_index: int
) -> dict[str, object]:
    log = RESULTS / f"engine-stop-{label}-{round_index}.log"
    process = start(kind, args.model, args.port, args, log)
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)  # the server's own process, as `kill PID` does
    try:
        code = process.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        code = process.wait(10)
    took = time.monotonic() - began
    text = log.read_text(errors="replace")
    return {
        "target": label,
        "exit_code": code,
        "stop_s": took,
        "engines_s": engines_part(text) if kind == "sluicegate" else None,
        "force_killed": "force killing" in text,
    }


def busy() -> None:
    while True:
        pass


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--baseline-src", help="another tree's src/ for a second sluicegate")
        parser.add_argument("--busy", type=int, default=0, help="busy loops run meanwhile")

    args = parse_args(__doc__.splitlines()[0], [1], 1, 1, 4, 8795, extra)
    targets = [("sluicegate", "sluicegate", None), ("vllm", "vllm", None)]
    if args.baseline_src:
        targets.append(("sluicegate", "baseline", str(Path(args.baseline_src).resolve())))
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for loop in loops:
        loop.start()
    runs: list[dict[str, object]] = []
    try:
        for round_index in range(args.rounds):
            shift = round_index % len(targets)
            for kind, label, src in targets[shift:] + targets[:shift]:
                saved = os.environ.get("PYTHONPATH")
                if src is not None:
                    os.environ["PYTHONPATH"] = src
                try:
                    runs.append(stop_once(kind, label, args, round_index))
                finally:
                    if src is not None:
                        if saved is None:
                            os.environ.pop("PYTHONPATH", None)
                        else:
                            os.environ["PYTHONPATH"] = saved
                print(runs[-1], flush=True)
    finally:
        for loop in loops:
            loop.terminate()
    publish(
        "engine-stop",
        f"Stops, {args.rounds} rounds, {args.busy} busy loops ({machine()})",
        runs,
        report(runs),
    )


def report(runs: list[dict[str, object]]) -> str:
    labels = list(dict.fromkeys(str(run["target"]) for run in runs))

    def median(label: str, key: str) -> float | None:
        values = [float(r[key]) for r in runs if r["target"] == label and r[key] is not None]  # type: ignore[arg-type]
        return statistics.median(values) if values else None

    vllm = median("vllm", "stop_s")
    lines = [
        "| target | stops | median stop (s) | vs vLLM's server | median engines' part (s) "
        "| force killed | exit codes |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        mine = [r for r in runs if r["target"] == label]
        stop = median(label, "stop_s")
        engines = median(label, "engines_s")
        ratio = f"{stop / vllm:.2f}x" if stop is not None and vllm else "-"
        lines.append(
            f"| {label} | {len(mine)} | {stop:.2f} | {ratio} | "
            f"{'-' if engines is None else f'{engines:.2f}'} | "
            f"{sum(bool(r['force_killed']) for r in mine)} | "
            f"{sorted({r['exit_code'] for r in mine})} |"  # type: ignore[type-var]
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
