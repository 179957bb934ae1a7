"""What a gateway adds in front of a fast streaming upstream: sluicegate in upstream mode
against the LiteLLM proxy, the same upstream called directly as the baseline, one run.

The upstream is `tests/support/fault_upstream.py` with no fault: an OpenAI-compatible server whose
answers are 32 precomputed chunks sent with no delay, so what is measured is the gateways.
Three targets, each a streamed chat completion (`stream_options.include_usage`):

- direct: the upstream itself;
- sluicegate: `sluicegate serve` with `SLUICEGATE_UPSTREAM_URLS` set to it, its defaults
  otherwise (aiohttp's transport under httpx), the response cache off (the requests repeat)
  and no API keys;
- sluicegate-b: the same with one setting changed (`--variant`): httpcore
  (`SLUICEGATE_UPSTREAM_TRANSPORT=httpcore`, httpx's own HTTP/1.1 stack; the default) or
  rendered (`SLUICEGATE_UPSTREAM_PASS_THROUGH=false`: every chunk parsed and rendered), on
  the port after it;
- litellm: the LiteLLM proxy (`litellm[proxy]` and httptools, in a venv of its own: its
  pins clash with the project's), one worker, routing every model to the upstream, with no
  database, no callbacks, no retries, no keys and errors-only logging (`litellm_config`).

The load comes from one client process (aiohttp on uvloop; the machine's two cores are
shared by the client, the upstream and the gateway). At each `--concurrency` level that
many streams are kept open, each sending its next request when its last ends, for
max(`--min-requests`, `--requests-per-slot` x concurrency) requests per turn. Each request's
time to first byte (the first body bytes) and total time (to the end of `data: [DONE]`) are
kept. At 1 the figures are the gateway's own time per request; at 100 the machine is
saturated, so a request's latency is mostly its wait for a core, and the overhead is what
the gateway's CPU per request costs everyone in the queue.

The targets take turns, one turn each per level per round, the order rotating from round to
round (each target in each place equally often over four rounds), so the machine's drift
falls on all four alike; every turn begins with an unmeasured wave (`concurrency`
requests) to reopen the pools that idled while the others ran. Latencies are pooled over
rounds. A gateway's overhead is its percentile minus the direct one's, at P50 and P99. Also
reported: each target's server CPU per request (the process tree serving it, from /proc:
the upstream for direct, the gateway alone otherwise) and P50 overheads round by round.

    .venv/bin/python bench/upstream_overhead.py                          # 1 and 100, 8 rounds
    .venv/bin/python bench/upstream_overhead.py --sluicegate-stand-in    # check the harness
    .venv/bin/python bench/upstream_overhead.py --reasoning 16           # a reasoning model's

With `--reasoning N` the upstream thinks first, as vLLM's server with a reasoning parser
writes it: N `{"reasoning": ...}` chunks before the answer's (and the usage's
`completion_tokens_details`); sluicegate passes such streams through as it does any other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream

from compare_vllm import RESULTS, ROOT, machine, publish, stop, wait_ready
from overhead_ab import cpu_times

TARGETS = ("direct", "sluicegate", "sluicegate-b", "litellm")
VARIANTS: dict[str, tuple[dict[str, str], str, str]] = {
    # name: (sluicegate-b's settings, sluicegate's label, sluicegate-b's label)
    "httpcore": ({"SLUICEGATE_UPSTREAM_TRANSPORT": "httpcore"}, "aiohttp", "httpcore"),
    "rendered": ({"SLUICEGATE_UPSTREAM_PASS_THROUGH": "false"}, "pass-through", "rendered"),
}
GATEWAYS = TARGETS[1:]
MODEL = "fault-model"


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str  # the chat completions URL
    pid: int  # the root of the process tree that serves it


def litellm_config(upstream: str) -> dict[str, Any]:
    """LiteLLM routing every model to `upstream` (a base URL ending in /v1), set up as a fair
    operator tuning for latency would: no database (so no spend logs or key checks), no
    callbacks, no retries, no cost lookups over the network, errors-only logging."""
    route = {"api_base": upstream, "api_key": "none"}
    return {
        "model_list": [
            {"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", **route}},
            {"model_name": "*", "litellm_params": {"model": "openai/*", **route}},
        ],
        "litellm_settings": {
            "callbacks": [],
            "num_retries": 0,
            "request_timeout": 600,
            "set_verbose": False,
            "drop_params": True,
            "turn_off_message_logging": True,
        },
        "general_settings": {
            "disable_spend_logs": True,
            "disable_error_logs": True,
            "disable_reset_budget": True,
            # No keys on either gateway (1.108 refuses to start keyless unless told).
            "dangerously_permit_weak_or_unset_master_key": True,
        },
    }


def litellm_env() -> dict[str, str]:
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map from the package, not fetched
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
    }


def start_process(
    command: list[str], env: dict[str, str], ready: str, name: str, timeout_s: float = 300
) -> subprocess.Popen[bytes]:
    """Start a server in its own process group, logging to bench/results, until `ready`
    answers 200."""
    log = RESULTS / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=ROOT,
        )  # fmt: skip
    wait_ready(ready, process, f"{name} (see {log})", timeout_s)
    return process


def start_sluicegate(
    port: int, upstreams: str, extra: dict[str, str] | None = None, name: str = "sluicegate"
) -> subprocess.Popen[bytes]:
    """sluicegate in upstream mode in front of `upstreams` (comma-separated base URLs), its
    response cache off and no API keys, its other settings the defaults or `extra`'s."""
    env = {
        **os.environ,
        "SLUICEGATE_UPSTREAM_URLS": upstreams,
        "SLUICEGATE_CACHE_POLICY": "off",
        "PYTHONPATH": str(ROOT / "src"),
        **(extra or {}),
    }
    for variable in ("SLUICEGATE_API_KEYS", "SLUICEGATE_REDIS_URL"):
        env.pop(variable, None)
    command = [sys.executable, "-m", "sluicegate", "serve", "--port", str(port)]
    return start_process(command, env, f"http://127.0.0.1:{port}/ready", name)


def start_litellm(executable: Path, port: int, upstream: str) -> subprocess.Popen[bytes]:
    config = RESULTS / "upstream-overhead-litellm.yaml"
    config.write_text(json.dumps(litellm_config(upstream), indent=1))  # JSON is YAML
    command = [
        str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        "--num_workers", "1",
    ]  # fmt: skip
    ready = f"http://127.0.0.1:{port}/health/liveliness"
    return start_process(command, litellm_env(), ready, "upstream-overhead-litellm")


def request_body(index: int, max_tokens: int) -> bytes:
    return json.dumps({
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about sluice gates ({index})."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
    }).encode()  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reading:
    ttfb: float
    latency: float
    tokens: int
    """The completion tokens the stream's usage event reports (0 without one)."""
    complete: bool


async def send(http: aiohttp.ClientSession, url: str, body: bytes) -> Reading:
    """One streamed request: first body bytes, end, [DONE] at the end, and the completion
    tokens of its usage event (read after the clock stopped). Not the number of events: a
    gateway may join the events that came in one read (sluicegate does)."""
    started = time.perf_counter()
    first = 0.0
    pieces = []
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
        async for data in r.content.iter_any():
            if not first:
                first = time.perf_counter()
            pieces.append(data)
    end = time.perf_counter()
    whole = b"".join(pieces)
    return Reading(
        first - started, end - started, usage_tokens(whole), whole.endswith(b"data: [DONE]\n\n")
    )


def usage_tokens(stream: bytes) -> int:
    """`usage.completion_tokens` of the last event that has a usage, else 0."""
    for line in reversed(stream.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage.get("completion_tokens") or 0)
    return 0


async def load(
    url: str, requests: int, concurrency: int, max_tokens: int, thoughts: int = 0
) -> dict[str, Any]:
    """`requests` streams through `concurrency` workers, each sending its next as its last
    ends; throughput over the whole turn. Each must end whole, its usage counting its
    `max_tokens` and the upstream's `thoughts` chunks."""
    connector = aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=120)
    readings: list[Reading] = []
    left = iter(range(requests))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def worker() -> None:
            for index in left:
                readings.append(await send(http, url, request_body(index, max_tokens)))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    broken = [r for r in readings if not r.complete or r.tokens != max_tokens + thoughts]
    if broken:
        raise SystemExit(f"{url}: {len(broken)} streams ended early or short")
    return {
        "req_per_s": len(readings) / elapsed,
        "ttfb": [r.ttfb for r in readings],
        "latency": [r.latency for r in readings],
    }


def requests_at(concurrency: int, args: argparse.Namespace) -> int:
    return max(args.min_requests, args.requests_per_slot * concurrency)


def turn(target: Target, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    """A warm-up wave, then the measured load, with the CPU the target's processes spent."""
    import uvloop

    requests = requests_at(concurrency, args)
    thoughts = getattr(args, "reasoning", 0)
    uvloop.run(load(target.url, concurrency, concurrency, args.chunks, thoughts))
    before = cpu_times(target.pid)
    result = uvloop.run(load(target.url, requests, concurrency, args.chunks, thoughts))
    after = cpu_times(target.pid)
    ran = sum(a[0] - before[name][0] for name, a in after.items() if name in before)
    return {**result, "cpu_ms_per_request": 1000 * ran / requests}


def schedule(rounds: int, levels: list[int]) -> list[tuple[int, int, tuple[str, ...]]]:
    """`(round, level, order)` in running order: the targets rotated by round and level."""
    return [
        (r, level, TARGETS[(r + i) % len(TARGETS) :] + TARGETS[: (r + i) % len(TARGETS)])
        for r in range(rounds)
        for i, level in enumerate(levels)
    ]


Results = dict[int, dict[str, list[dict[str, Any]]]]  # level -> target -> one per round


def run(args: argparse.Namespace) -> Results:
    processes: list[subprocess.Popen[bytes]] = []
    upstream: FaultUpstreamProcess | None = None
    results: Results = {level: {name: [] for name in TARGETS} for level in args.concurrency}
    try:
        upstream = start_upstream(
            args.port, "--chunks", str(args.chunks), "--delay", "0",
            log=RESULTS / "upstream-overhead-upstream.log",
        )  # fmt: skip
        if args.reasoning:
            upstream.control(reasoning=[f" thought{i}." for i in range(args.reasoning)])
        direct = Target("direct", f"{upstream.url}/chat/completions", upstream.process.pid)
        targets = {"direct": direct}
        settings = VARIANTS[args.variant][0]
        for offset, (name, extra) in enumerate((("sluicegate", {}), ("sluicegate-b", settings)), 1):
            if args.sluicegate_stand_in:
                targets[name] = Target(name, direct.url, direct.pid)
                continue
            processes.append(
                start_sluicegate(
                    args.port + offset, upstream.url, extra, name=f"upstream-overhead-{name}"
                )
            )
            targets[name] = Target(
                name, f"http://127.0.0.1:{args.port + offset}/v1/chat/completions",
                processes[-1].pid,
            )  # fmt: skip
        processes.append(start_litellm(args.litellm, args.port + 3, upstream.url))
        targets["litellm"] = Target(
            "litellm", f"http://127.0.0.1:{args.port + 3}/v1/chat/completions", processes[-1].pid
        )
        for round_index, level, order in schedule(args.rounds, args.concurrency):
            for name in order:
                print(f"--- round {round_index + 1}, concurrency {level}: {name}", flush=True)
                results[level][name].append(turn(targets[name], level, args))
    finally:
        for process in processes:
            stop(process)
        if upstream is not None:
            upstream.stop()
    return results


def percentiles(rounds: list[dict[str, Any]], field: str) -> tuple[float, float]:
    """P50 and P99 in ms of `field` over every request of every round."""
    values = [v for r in rounds for v in r[field]]
    p50, p99 = numpy.percentile(values, [50, 99])
    return 1000 * float(p50), 1000 * float(p99)


def report(results: Results, stand_in: bool, variant: str = "httpcore") -> str:
    stand = " (stand-in: direct)" if stand_in else ""
    _, a, b = VARIANTS[variant]
    label = {"direct": "upstream directly", "litellm": "LiteLLM proxy",
             "sluicegate": f"sluicegate ({a}){stand}",
             "sluicegate-b": f"sluicegate ({b}){stand}"}  # fmt: skip
    lines = [
        "| concurrency | target | req/s | P50 latency ms | P99 latency ms | P50 TTFB ms "
        "| P99 TTFB ms | server CPU ms/request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    overheads = [
        "| concurrency | overhead over direct | P50 latency ms | P99 latency ms | P50 TTFB ms "
        "| P99 TTFB ms |",
        "|---|---|---|---|---|---|",
    ]
    by_round = ["P50 latency overhead, round by round (ms):", ""]
    for level, level_results in results.items():
        figures = {
            name: {
                "latency": percentiles(rounds, "latency"),
                "ttfb": percentiles(rounds, "ttfb"),
                "req/s": statistics.median(r["req_per_s"] for r in rounds),
                "cpu": statistics.median(r["cpu_ms_per_request"] for r in rounds),
            }
            for name, rounds in level_results.items()
        }
        for name in TARGETS:
            f = figures[name]
            lines.append(
                f"| {level} | {label[name]} | {f['req/s']:.1f} | {f['latency'][0]:.2f} "
                f"| {f['latency'][1]:.2f} | {f['ttfb'][0]:.2f} | {f['ttfb'][1]:.2f} "
                f"| {f['cpu']:.2f} |"
            )
        added = {name: _added(figures[name], figures["direct"]) for name in GATEWAYS}
        for name in GATEWAYS:
            cells = " | ".join(f"{v:.2f}" for v in added[name])
            overheads.append(f"| {level} | {label[name]} | {cells} |")
        for name in ("sluicegate", "sluicegate-b"):
            ratios = [
                s / v if v > 0 else float("nan")
                for s, v in zip(added[name], added["litellm"], strict=True)
            ]
            cells = " | ".join(f"**{r:.3f}x**" for r in ratios)
            overheads.append(f"| {level} | **{label[name]} / LiteLLM** | {cells} |")
        for name in GATEWAYS:
            per_round = [
                1000 * (statistics.median(g["latency"]) - statistics.median(d["latency"]))
                for g, d in zip(level_results[name], level_results["direct"], strict=True)
            ]
            values = ", ".join(f"{v:.2f}" for v in per_round)
            by_round.append(f"- concurrency {level}, {label[name]}: {values}")
    return "\n".join([*lines, "", *overheads, "", *by_round])


def _added(gateway: dict[str, Any], direct: dict[str, Any]) -> list[float]:
    return [
        gateway["latency"][0] - direct["latency"][0],
        gateway["latency"][1] - direct["latency"][1],
        gateway["ttfb"][0] - direct["ttfb"][0],
        gateway["ttfb"][1] - direct["ttfb"][1],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--requests-per-slot", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument(
        "--reasoning", type=int, default=0,
        help="chunks of thought the upstream streams before the answer (vLLM's deltas)",
    )  # fmt: skip
    parser.add_argument(
        "--variant", choices=sorted(VARIANTS), default="httpcore",
        help="what the second sluicegate changes: its transport, or pass-through off",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8830, help="upstream; gateways on +1 to +3")
    parser.add_argument(
        "--litellm", type=Path, default=ROOT / ".venv-litellm" / "bin" / "litellm",
        help="the litellm executable (make bench-upstream installs it in .venv-litellm)",
    )  # fmt: skip
    parser.add_argument(
        "--sluicegate-stand-in", action="store_true",
        help="measure the upstream directly in sluicegate's place (checks the harness)",
    )  # fmt: skip
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = run(args)
    heading = (
        f"Machine: {machine()}; {args.rounds} rounds; streamed chat completions of "
        f"{args.chunks} chunks; per turn, concurrency: requests "
        + ", ".join(f"{c}: {requests_at(c, args)}" for c in args.concurrency)
        + f"; {time.strftime('%Y-%m-%d')}"
    )
    heading += f"; second sluicegate: {args.variant}"
    if args.reasoning:
        heading += f"; the upstream thinks first: {args.reasoning} chunks of `reasoning`"
    publish(
        "upstream-overhead", heading, results,
        report(results, args.sluicegate_stand_in, args.variant),
    )  # fmt: skip


if __name__ == "__main__":
    main()
