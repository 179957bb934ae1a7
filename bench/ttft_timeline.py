"""Where time to first token goes, sluicegate against vLLM's server, paired A-B-B-A.

Each server in turn (same model, engine flags and load as `compare_vllm.py`) serves
`--requests` requests at one concurrency, sampled at `--temperature`. Around each run the
server's `/metrics` is read, and from the differences, per request:

- the engine's own split, from vLLM's histograms (both servers export them):
  `vllm:request_queue_time_seconds` (waiting queue), `vllm:request_prefill_time_seconds`,
  `vllm:time_to_first_token_seconds` (from the arrival the server handed the engine);
- sluicegate's request timeline (`sluicegate_request_phase_seconds`: prepare, wait,
  hand_off, queue, prefill, deliver, write), which puts the gateway's own phases around the
  engine's;
- the client's mean and median TTFT (`vllm.benchmarks.serve`).

The client's TTFT minus the engine's is what each server's front end adds before the engine
and after it; the engine's queue and prefill say whether the requests reached the engine
differently.

    .venv/bin/python bench/ttft_timeline.py                    # concurrency 16, temperature 0.8
    .venv/bin/python bench/ttft_timeline.py --level 64 --requests 128 --temperature 0
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from compare_vllm import RESULTS, machine, paired_runs, parse_args, probed_run, publish

ENGINE = {
    "engine TTFT": "vllm:time_to_first_token_seconds",
    "engine queue": "vllm:request_queue_time_seconds",
    "engine prefill": "vllm:request_prefill_time_seconds",
}
PHASE = "sluicegate_request_phase_seconds"
PHASES = ("prepare", "wait", "hand_off", "queue", "prefill", "deliver", "write")


def totals(exposition: str) -> dict[str, tuple[float, float]]:
    """`(sum, count)` of each histogram this bench reads, over all label sets; the gateway's
    phases by phase."""
    found: dict[str, tuple[float, float]] = {}
    wanted = {name: label for label, name in ENGINE.items()}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            base, _, part = sample.name.rpartition("_")
            if part not in ("sum", "count"):
                continue
            if base in wanted:
                key = wanted[base]
            elif base == PHASE:
                key = f"phase {sample.labels.get('phase', '')}"
            else:
                continue
            total, count = found.get(key, (0.0, 0.0))
            if part == "sum":
                found[key] = (total + sample.value, count)
            else:
                found[key] = (total, count + sample.value)
    return found


def means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Each histogram's mean over the run, in ms."""
    means = {}
    for key, (total, count) in after.items():
        total_before, count_before = before.get(key, (0.0, 0.0))
        if count > count_before:
            means[key] = (total - total_before) / (count - count_before) * 1000
    return means


def measure(kind: str, repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    metrics = f"http://127.0.0.1:{args.port}/metrics"

    def probe(_: int) -> dict[str, tuple[float, float]]:
        return totals(httpx.get(metrics, timeout=30).text)

    log = RESULTS / f"timeline-{kind}-server.log"
    result, before, after = probed_run(kind, repeat, args, log, probe)
    ttfts = [t * 1000 for t in result["ttfts"]]
    return {
        "client mean TTFT": statistics.fmean(ttfts),
        "client median TTFT": statistics.median(ttfts),
        "median TPOT": result["median_tpot_ms"],
        "out tok/s": result["output_throughput"],
        **means_ms(before, after),
    }


COLUMNS = (
    "client mean TTFT",
    "client median TTFT",
    "engine TTFT",
    "engine queue",
    "engine prefill",
    "median TPOT",
    "out tok/s",
)


def table(runs: list[dict[str, Any]]) -> str:
    head = " | ".join(COLUMNS)
    lines = [f"| repeat | server | {head} |", "|---|---|" + "---|" * len(COLUMNS)]
    for run in runs:
        values = " | ".join(_cell(run.get(column)) for column in COLUMNS)
        lines.append(f"| {run['repeat'] + 1} | {run['kind']} | {values} |")
    lines += ["", "sluicegate's timeline, mean ms per request:", ""]
    lines += ["| repeat | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for run in runs:
        if run["kind"] == "sluicegate":
            values = " | ".join(_cell(run.get(f"phase {p}")) for p in PHASES)
            lines.append(f"| {run['repeat'] + 1} | {values} |")
    lines += ["", "Ratios sluicegate / vLLM, means over the repeats:", ""]
    for column in COLUMNS:
        ours = [r[column] for r in runs if r["kind"] == "sluicegate" and column in r]
        theirs = [r[column] for r in runs if r["kind"] == "vllm" and column in r]
        if ours and theirs:
            ratio = statistics.fmean(ours) / statistics.fmean(theirs)
            lines.append(f"- {column}: {ratio:.2f}x")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--level", type=int, default=16, help="concurrency")
        parser.add_argument("--requests", type=int, default=64)
        parser.add_argument("--repeats", type=int, default=2)

    args = parse_args(__doc__.splitlines()[0], [16], 1, 1, 1, 8794, extra)
    if args.temperature is None:
        args.temperature = 0.8
    runs = paired_runs(args, measure)
    heading = (
        f"Machine: {machine()}; concurrency {args.level}, {args.requests} requests per run, "
        f"{args.input_len} tokens in / {args.output_len} out, temperature {args.temperature}; "
        f"{time.strftime('%Y-%m-%d')}"
    )
    publish("ttft-timeline", heading, runs, table(runs))


if __name__ == "__main__":
    main()
