"""What a change to sluicegate's source does to upstream mode's overhead at concurrency 1: two
source trees of sluicegate, A and B, in front of the same fast upstream, paired in one run.

Issue 32's upstream target (at most 1.0 ms added at P50 per 32-chunk stream at concurrency 1)
is a matter of tens of microseconds per change, which this machine's drift between runs
(a tenth of a millisecond or more) hides: this compares two trees in one invocation instead.
Each tree is `git archive`d from a revision (`worktree`: the working tree as it is) into a
folder of its own and served with `PYTHONPATH` pointing at it, the same venv for both. The
upstream is `tests/support/fault_upstream.py` with no fault and no delay (32 chunks), the load
`upstream_overhead.py`'s client (aiohttp on uvloop, one stream at a time, each turn opened by
an unmeasured request). The targets take turns, direct, A and B, the order rotating by round.

Reported per tree: the added latency (its P50 minus the direct P50 of the same round), the
added time to first byte, and the gateway's CPU per stream (its process, from /proc), each the
median of the rounds, and B's difference from A, round by round.

    .venv/bin/python bench/upstream_ab.py --a HEAD --b worktree
    .venv/bin/python bench/upstream_ab.py --a HEAD~1 --b HEAD --rounds 12 --requests 600
    .venv/bin/python bench/upstream_ab.py --a HEAD --b worktree --reasoning 16  # thinking first
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fault_upstream import start as start_upstream

from compare_vllm import RESULTS, ROOT, machine, publish, stop
from upstream_overhead import Target, start_sluicegate, turn

WORKTREE = "worktree"


def source_tree(revision: str, into: Path) -> Path:
    """The `src` folder of `revision` (or of the working tree) under `into`."""
    into.mkdir(parents=True)
    if revision == WORKTREE:
        shutil.copytree(ROOT / "src", into / "src")
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def run(args: argparse.Namespace, folder: Path) -> dict[str, list[dict[str, Any]]]:
    upstream = start_upstream(
        args.port, "--chunks", "32", "--delay", "0", log=RESULTS / "upstream-ab-upstream.log"
    )
    processes = []
    if args.reasoning:
        upstream.control(reasoning=[f" thought{i}." for i in range(args.reasoning)])
    try:
        targets = {
            "direct": Target("direct", f"{upstream.url}/chat/completions", upstream.process.pid)
        }
        for offset, (name, revision) in enumerate((("A", args.a), ("B", args.b)), 1):
            src = source_tree(revision, folder / name)
            port = args.port + offset
            processes.append(
                start_sluicegate(
                    port,
                    upstream.url,
                    {"PYTHONPATH": str(src), "SLUICEGATE_LOG_LEVEL": "warning"},
                    name=f"upstream-ab-{name}",
                )
            )
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            targets[name] = Target(name, url, processes[-1].pid)
        load = argparse.Namespace(
            requests_per_slot=args.requests,
            min_requests=args.requests,
            chunks=32,
            reasoning=args.reasoning,
        )
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        names = list(targets)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(turn(targets[name], 1, load))
        return results
    finally:
        for process in processes:
            stop(process)
        upstream.stop()


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    direct = results["direct"]

    def added(name: str, field: str) -> list[float]:
        return [
            statistics.median(mine[field]) - statistics.median(theirs[field])
            for mine, theirs in zip(results[name], direct, strict=True)
        ]

    lines = [
        "| tree | revision | added P50 latency ms | added P50 TTFB ms | gateway CPU ms/stream |",
        "|---|---|---|---|---|",
    ]
    for name, revision in (("A", args.a), ("B", args.b)):
        cpu = [r["cpu_ms_per_request"] for r in results[name]]
        lines.append(
            f"| {name} | {revision} | {median_ms(added(name, 'latency')):.3f} | "
            f"{median_ms(added(name, 'ttfb')):.3f} | {statistics.median(cpu):.3f} |"
        )
    latency = [b - a for a, b in zip(added("A", "latency"), added("B", "latency"), strict=True)]
    cpu = [
        b["cpu_ms_per_request"] - a["cpu_ms_per_request"]
        for a, b in zip(results["A"], results["B"], strict=True)
    ]
    lines += [
        "",
        f"B - A, added P50 latency: median {median_ms(latency):+.3f} ms; round by round: "
        + ", ".join(f"{1000 * v:+.2f}" for v in latency),
        "",
        f"B - A, CPU per stream: median {statistics.median(cpu):+.3f} ms; round by round: "
        + ", ".join(f"{v:+.3f}" for v in cpu),
        "",
        "Direct P50 latency, round by round (ms): "
        + ", ".join(f"{median_ms(r['latency']):.2f}" for r in direct),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default="HEAD", help="a revision, or 'worktree'")
    parser.add_argument("--b", default=WORKTREE, help="a revision, or 'worktree'")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--reasoning", type=int, default=0,
        help="chunks of thought the upstream streams first (vLLM's `reasoning` deltas)",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=600, help="streams per turn")
    parser.add_argument("--port", type=int, default=8840, help="upstream; A and B on +1, +2")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluicegate-ab-") as folder:
        results = run(args, Path(folder))
    heading = (
        f"Machine: {machine()}; {args.rounds} rounds of {args.requests} streamed chat "
        f"completions of 32 chunks at concurrency 1; {time.strftime('%Y-%m-%d')}"
    )
    if args.reasoning:
        heading += f"; the upstream thinks first: {args.reasoning} chunks of `reasoning`"
    publish("upstream-ab", heading, results, report(results, args))


if __name__ == "__main__":
    main()
