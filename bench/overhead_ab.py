"""The gateway's own share of TTFT, like for like: sluicegate against vLLM's server, paired.

Each server in turn (same model, engine flags and load as `compare_vllm.py`; the order
alternates between repetitions, so each pair runs back to back) serves `--requests` requests
at one concurrency. For each run:

- the client's mean TTFT (`vllm.benchmarks.serve`) and the engine's own mean TTFT, read from
  `vllm:time_to_first_token_seconds` on the server's `/metrics` before and after. Both
  servers hand the engine the moment they began preparing a request (its arrival), so the
  difference is what the HTTP server, the routes and the hand-off add on either side;
- median TPOT and output tok/s;
- CPU time and run-queue wait of each process of the server (the API process, vLLM's engine
  core and its worker), from `/proc/<pid>/task/*/schedstat`.

    .venv/bin/python bench/overhead_ab.py                       # concurrency 1, 20 requests
    .venv/bin/python bench/overhead_ab.py --repeats 3 --requests 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from compare_vllm import RESULTS, machine, paired_runs, parse_args, probed_run, publish

ENGINE_TTFT = "vllm:time_to_first_token_seconds"


def histogram_totals(exposition: str, name: str) -> tuple[float, float]:
    """`(sum, count)` of a histogram in Prometheus text, added over all its label sets."""
    total = count = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    return [root, *(child.pid for child in psutil.Process(root).children(recursive=True))]


def cpu_times(root: int) -> dict[str, tuple[float, float]]:
    """Per process of the tree (named `comm:pid`, the root `api:pid`): seconds run and seconds
    waited for a core, summed over its threads (one that ends drops out of later readings)."""
    times: dict[str, tuple[float, float]] = {}
    for pid in process_tree(root):
        try:
            name = "api" if pid == root else Path(f"/proc/{pid}/comm").read_text().strip()
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # the process ended
            continue
        ran = waited = 0
        for task in tasks:
            try:
                fields = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()
            except OSError:  # the thread ended
                continue
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        times[f"{name}:{pid}"] = (ran / 1e9, waited / 1e9)
    return times


def spent_between(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """What each process (by name, pids of one name added up) ran and waited in between;
    processes that ran under 50 ms (vLLM's resource tracker, ...) are left out."""
    spent: dict[str, tuple[float, float]] = {}
    for name, (ran, waited) in after.items():
        if name not in before or ran - before[name][0] < 0.05:
            continue
        comm = name.rsplit(":", 1)[0]
        so_far = spent.get(comm, (0.0, 0.0))
        spent[comm] = (so_far[0] + ran - before[name][0], so_far[1] + waited - before[name][1])
    return spent


def measure(kind: str, repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    metrics = f"http://127.0.0.1:{args.port}/metrics"

    def probe(pid: int) -> tuple[dict[str, tuple[float, float]], tuple[float, float]]:
        return cpu_times(pid), histogram_totals(httpx.get(metrics).text, ENGINE_TTFT)

    log = RESULTS / f"ab-{kind}-server.log"
    result, (cpu_before, engine_before), (cpu_after, engine_after) = probed_run(
        kind, repeat, args, log, probe
    )
    served = engine_after[1] - engine_before[1]
    if served != args.requests:
        raise SystemExit(
            f"{kind}: the engine counted {served:.0f} first tokens, not {args.requests}"
        )
    return {
        "client_ttft_ms": statistics.fmean(result["ttfts"]) * 1000,
        "engine_ttft_ms": (engine_after[0] - engine_before[0]) / served * 1000,
        "median_tpot_ms": result["median_tpot_ms"],
        "output_throughput": result["output_throughput"],
        "processes": spent_between(cpu_before, cpu_after),
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| repeat | server | client mean TTFT ms | engine mean TTFT ms | difference ms "
        "| median TPOT ms | out tok/s | CPU s (wait s) per process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        processes = ", ".join(
            f"{name} {ran:.1f} ({waited:.2f})" for name, (ran, waited) in run["processes"].items()
        )
        lines.append(
            f"| {run['repeat'] + 1} | {run['kind']} | {run['client_ttft_ms']:.1f} "
            f"| {run['engine_ttft_ms']:.1f} | {run['client_ttft_ms'] - run['engine_ttft_ms']:.1f} "
            f"| {run['median_tpot_ms']:.2f} | {run['output_throughput']:.2f} | {processes} |"
        )
    return "\n".join(lines)


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--level", type=int, default=1, help="concurrency")
        parser.add_argument("--requests", type=int, default=20)
        parser.add_argument("--repeats", type=int, default=2)

    args = parse_args(__doc__.splitlines()[0], [1], 1, 1, 1, 8792, extra)
    runs = paired_runs(args, measure)
    heading = (
        f"Machine: {machine()}; concurrency {args.level}, {args.requests} requests per run, "
        f"{args.input_len} tokens in / {args.output_len} out; {time.strftime('%Y-%m-%d')}"
    )
    publish("overhead-ab", heading, runs, table(runs))


if __name__ == "__main__":
    main()
