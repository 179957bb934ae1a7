"""What a second worker gives: cache hits and upstream streams per second, one worker against
two (`SLUICEGATE_WORKERS`), beside what a bare FastAPI endpoint gains from a second uvicorn
worker, in one run, rounds interleaved.

Every server runs at once on this machine, beside the load generator (wrk) and, for the
streams, the fault upstream (`tests.support.fault_upstream`, 32 chunks a stream): on two cores
they all share the same two. The gateways are in upstream mode (no engine to start) with their
cache in Redis; the hits are 32 distinct cached prompts, round robin; the streams are not
cached (temperature 1).

    .venv/bin/python bench/workers.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.support.fault_upstream import start as start_upstream  # noqa: E402
from tests.support.gateway import GatewayProcess, free_port, start_gateway  # noqa: E402

from cache_hits import seed, start_bare, wrk  # noqa: E402

MODEL = "fault-model"


def payloads(count: int, stream: bool, tag: str, temperature: float) -> list[str]:
    return [
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Name a river ({tag}-{i})."}],
                "temperature": temperature,
                "max_tokens": 32,
                "stream": stream,
            }
        )
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    args = parser.parse_args()
    logs = ROOT / "bench" / "results" / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    upstream = start_upstream(0, "--chunks", "32", log=logs / "upstream.log")
    gateways: dict[int, GatewayProcess] = {}
    bare: dict[int, subprocess.Popen[bytes]] = {}
    bare_urls: dict[int, str] = {}
    run = uuid.uuid4().hex[:8]
    try:
        for workers in (1, 2):
            gateways[workers] = start_gateway(
                logs,
                env={
                    "SLUICEGATE_UPSTREAM_URLS": upstream.url,
                    "SLUICEGATE_REDIS_URL": args.redis_url,
                    "SLUICEGATE_REDIS_KEY_PREFIX": f"bench-{run}-{workers}",
                    "SLUICEGATE_WORKERS": str(workers),
                    "SLUICEGATE_LOG_LEVEL": "warning",
                },
            )
            port = free_port()
            bare[workers] = start_bare(port, workers)
            bare_urls[workers] = f"http://127.0.0.1:{port}"
        hits = payloads(32, False, run, 0.0)
        for gateway in gateways.values():
            seed(gateway.url, hits)
        streams = payloads(32, True, run, 1.0)
        results: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            order = (1, 2) if round_ % 2 == 0 else (2, 1)
            for workers in order:
                for name, url, load in (
                    (f"hits, {workers} worker(s)", gateways[workers].url, hits),
                    (f"streams, {workers} worker(s)", gateways[workers].url, streams),
                    (f"bare FastAPI, {workers} worker(s)", bare_urls[workers], hits),
                ):
                    measured = wrk(
                        url + "/v1/chat/completions", load, args.concurrency, args.duration
                    )
                    results.setdefault(name, []).append(measured["rps"])
                    print(f"round {round_ + 1}: {name}: {measured['rps']:.0f} req/s", flush=True)
        report(results, args)
    finally:
        for gateway in gateways.values():
            gateway.stop()
        for process in bare.values():
            process.terminate()
            process.wait(10)
        upstream.stop()


def report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    median = {name: statistics.median(values) for name, values in results.items()}
    print(f"\n{args.rounds} rounds of {args.duration} s at concurrency {args.concurrency}\n")
    print("| load | 1 worker (req/s) | 2 workers (req/s) | ratio |")
    print("|---|---|---|---|")
    gains = {}
    for load in ("hits", "streams", "bare FastAPI"):
        one, two = median[f"{load}, 1 worker(s)"], median[f"{load}, 2 worker(s)"]
        gains[load] = two / one
        print(f"| {load} | {one:.0f} | {two:.0f} | {two / one:.2f}x |")
    target = min(1.6, 0.9 * gains["bare FastAPI"])
    print(f"\ntarget: min(1.6, 0.9 x bare FastAPI's {gains['bare FastAPI']:.2f}x) = {target:.2f}x")
    print("every round:", json.dumps({k: [round(v) for v in vs] for k, vs in results.items()}))


if __name__ == "__main__":
    main()
