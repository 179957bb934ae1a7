"""Prefix affinity: two vLLM servers behind sluicegate in upstream mode, their prefix-cache
hit rate with `SLUICEGATE_UPSTREAM_PREFIX_AFFINITY` off and on, one run.

Two of vLLM's own OpenAI servers (the bundled model, the engine flags of `compare_vllm.py`,
prefix caching on, each engine's worker bound to a core of its own) stay up through the run.
sluicegate is started in front of both, once per phase, with affinity off or on (its
response cache off). The load is a shared-prefix workload: `--prefixes` long system prompts,
each asked `--questions` short questions, all in a random order, `--concurrency` at a time,
a few output tokens each (the prefill is what a prefix cache saves). Each phase draws its own
system prompts, so none starts with prompts an earlier phase left in a cache.

Each server's `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (tokens)
are read from its /metrics before and after a phase: the hit rate is hits / queries over
both. With the KV cache large enough to hold every prefix twice, affinity saves only each
prefix's second miss; `--num-blocks` caps each engine's KV blocks (vLLM's
`--num-gpu-blocks-override`) so that one engine cannot hold all the prefixes but holds its
half, which is where affinity matters most.

    .venv/bin/python bench/prefix_affinity.py                  # off, on
    .venv/bin/python bench/prefix_affinity.py --rounds 2       # off, on, on, off
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import machine, parse_args, publish, server_command, stop
from upstream_overhead import start_process, start_sluicegate

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
FILLER = [
    "gate", "river", "channel", "water", "level", "flow", "season", "field", "harvest", "storm",
    "spring", "summer", "autumn", "winter", "valley", "bridge", "stone", "wooden", "iron", "lock",
    "keeper", "meadow", "village", "mill", "wheel", "grain", "bread", "market", "road", "cart",
    "horse", "evening", "morning", "light", "shadow", "rain", "cloud", "wind", "north", "south",
    "ledger", "record", "measure", "height", "depth", "width", "rule", "duty", "order", "signal",
]  # fmt: skip


def counters(port: int) -> dict[str, float]:
    """The prefix-cache counters of the vLLM server on `port`."""
    return prefix_counters(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


def prefix_counters(text: str) -> dict[str, float]:
    """The prefix-cache counters in a Prometheus exposition, summed over their label sets."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in totals and sample.name.endswith("_total"):
                totals[name] += sample.value
    return totals


def affinity_picks(text: str) -> dict[str, float]:
    """sluicegate's `sluicegate_upstream_affinity_picks_total`, summed by `result`."""
    picks = {"home": 0.0, "spilled": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluicegate_upstream_affinity_picks_total":
                picks[sample.labels["result"]] += sample.value
    return picks


def workload(phase: int, args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """The phase's conversations: every system prompt with every question, shuffled."""
    rng = random.Random(phase)
    systems = [
        f"You are the keeper of sluice {phase}-{k}. Your standing orders follow. "
        + " ".join(rng.choice(FILLER) for _ in range(args.prefix_words))
        for k in range(args.prefixes)
    ]
    conversations = [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {q}: what of the {rng.choice(FILLER)}?"},
        ]
        for system in systems
        for q in range(args.questions)
    ]
    rng.shuffle(conversations)
    return conversations


async def drive(
    port: int, conversations: list[list[dict[str, str]]], args: argparse.Namespace
) -> dict[str, Any]:
    """The conversations through sluicegate, `concurrency` at a time; throughput overall."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    latencies: list[float] = []
    prompt_tokens = 0
    queue = iter(conversations)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def worker() -> None:
            nonlocal prompt_tokens
            for messages in queue:
                body = {"model": args.name, "messages": messages, "max_tokens": args.max_tokens,
                        "temperature": 0}  # fmt: skip
                started = time.perf_counter()
                async with http.post(url, json=body) as response:
                    answer = await response.json()
                    if response.status != 200:
                        raise SystemExit(f"{response.status}: {answer}")
                latencies.append(time.perf_counter() - started)
                prompt_tokens += answer["usage"]["prompt_tokens"]

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency_level)))
        elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "elapsed": elapsed,
        "prompt_tokens": prompt_tokens,
        "median_latency": statistics.median(latencies),
    }


def start_vllm(index: int, port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    command = server_command("vllm", args.model, port, args)
    if args.num_blocks:
        command += ["--num-gpu-blocks-override", str(args.num_blocks)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        # One core each: by default both engines would bind their worker to core 0.
        "VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1)),
    }
    return start_process(
        command, env, f"http://127.0.0.1:{port}/health", f"affinity-vllm-{index}", 600
    )


def phase(affinity: bool, index: int, ports: list[int], args: argparse.Namespace) -> dict[str, Any]:
    upstreams = ",".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    extra = {
        "SLUICEGATE_UPSTREAM_PREFIX_AFFINITY": str(affinity).lower(),
        "SLUICEGATE_UPSTREAM_AFFINITY_LOAD": str(args.affinity_load),
        "SLUICEGATE_UPSTREAM_HEALTH_PATH": "/health",
        "SLUICEGATE_TOKENIZER": args.model,
        "SLUICEGATE_MAX_MODEL_LEN": str(args.max_model_len),
    }
    gateway = start_sluicegate(args.port, upstreams, extra, f"affinity-sluicegate-{index}")
    try:
        before = [counters(p) for p in ports]
        result = asyncio.run(drive(args.port, workload(index, args), args))
        after = [counters(p) for p in ports]
        picks = affinity_picks(httpx.get(f"http://127.0.0.1:{args.port}/metrics").text)
    finally:
        stop(gateway)
    per_upstream = [
        {name: a[name] - b[name] for name in COUNTERS} for a, b in zip(after, before, strict=True)
    ]
    return {
        "affinity": affinity, "phase": index, **result, "upstreams": per_upstream, "picks": picks,
    }  # fmt: skip


def table(phases: list[dict[str, Any]]) -> str:
    lines = [
        "| phase | affinity | requests | req/s | prompt tok/s | median latency ms "
        "| prefix-cache hit rate | queries per upstream (tokens) | hits per upstream "
        "| affine picks: home / spilled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        queries = [u["vllm:prefix_cache_queries"] for u in p["upstreams"]]
        hits = [u["vllm:prefix_cache_hits"] for u in p["upstreams"]]
        rate = sum(hits) / sum(queries) if sum(queries) else float("nan")
        lines.append(
            f"| {p['phase'] + 1} | {'on' if p['affinity'] else 'off'} | {p['requests']} "
            f"| {p['requests'] / p['elapsed']:.2f} | {p['prompt_tokens'] / p['elapsed']:.0f} "
            f"| {1000 * p['median_latency']:.0f} | {100 * rate:.1f}% "
            f"| {_split(queries)} | {_split(hits)} "
            f"| {_split([p['picks']['home'], p['picks']['spilled']]) if p['affinity'] else '-'} |"
        )
    return "\n".join(lines)


def _split(values: list[float]) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


def order(rounds: int) -> list[bool]:
    """Off, on, then on, off, and so on: each setting first equally often over even rounds."""
    return [
        flag for r in range(rounds) for flag in ((False, True) if r % 2 == 0 else (True, False))
    ]


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--prefixes", type=int, default=8)
        parser.add_argument("--prefix-words", type=int, default=700)
        parser.add_argument("--questions", type=int, default=16, help="per prefix")
        parser.add_argument("--max-tokens", type=int, default=4)
        parser.add_argument("--num-blocks", type=int, help="cap each engine's KV cache blocks")
        parser.add_argument(
            "--affinity-load", type=float, default=2.0, help="SLUICEGATE_UPSTREAM_AFFINITY_LOAD"
        )

    args = parse_args(__doc__.splitlines()[0], [8], 1, 1, 1, 8850, extra)
    args.concurrency_level = args.concurrency[0]
    args.kv_cache_gib = min(args.kv_cache_gib, 2)
    ports = [args.port + 1, args.port + 2]
    engines: list[subprocess.Popen[bytes]] = []
    phases = []
    try:
        for index, port in enumerate(ports):
            engines.append(start_vllm(index, port, args))
        for index, affinity in enumerate(order(args.rounds)):
            print(f"--- phase {index + 1}: affinity {'on' if affinity else 'off'}", flush=True)
            phases.append(phase(affinity, index, ports, args))
    finally:
        for engine in engines:
            stop(engine)
    heading = (
        f"Machine: {machine()}; two vLLM servers behind sluicegate; {args.prefixes} system "
        f"prompts of ~{args.prefix_words} words x {args.questions} questions, random order, "
        f"concurrency {args.concurrency_level}, {args.max_tokens} output tokens; KV blocks per "
        f"engine: {args.num_blocks or 'default'}; affinity load bound {args.affinity_load}; "
        f"{time.strftime('%Y-%m-%d')}"
    )
    publish("prefix-affinity", heading, phases, table(phases))


if __name__ == "__main__":
    main()
