"""Embeddings: sluicegate's in-process pooling engine against vLLM's own server, same model
(the bundled SmolLM2 converted to embed, `--runner pooling --convert embed` on both), same
engine flags, one run, paired in time.

The load: `POST /v1/embeddings` with `--batch` inputs per request (64 by default), each a
sentence of 30 to 50 random words, `--requests` requests per turn at each `--concurrency`.
Two scenarios, each measured on both servers:

- **fresh**: every input new to both servers (sluicegate looks each one up in its cache on
  Redis, misses, computes, and writes it back: the whole cost of the cache per input);
- **90% seen**: nine inputs in ten were sent in an earlier request (a warm-up pass, sent to
  both servers alike, whose inputs are the measured batches' seen part in other batches);
  sluicegate computes only the new tenth, vLLM's server computes all of them.

The servers take turns as in `compare_vllm.py` (A-B-B-A, the idle one frozen with SIGSTOP);
sluicegate's cache is a real Redis started here. sluicegate runs its generative engine as
well (idle, and frozen with the rest of it while vLLM is measured).

    .venv/bin/python bench/embeddings_vllm.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import (
    KINDS,
    RESULTS,
    freeze,
    machine,
    publish,
    stop,
    thaw,
    turns,
    wait_port_free,
    wait_ready,
)

NAME = "smol-embed"
SEEN_SHARE = 0.9
_WORDS = """
river stone light paper window garden signal market winter engine cloud letter harbor
silver forest bridge morning question number orange planet memory travel kitchen music
doctor summer island pocket rabbit theory yellow basket candle dragon finger gentle
hollow jacket ladder marble needle oxygen pepper quiet rocket saddle timber velvet wagon
anchor bottle copper desert fabric glacier hammer iron jungle kettle lemon meadow
"""
WORDS = _WORDS.split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 50))) + "."


def batches(seed: int, requests: int, batch: int, seen: int) -> tuple[list[list[str]], list[str]]:
    """`requests` batches of `batch` inputs, `seen` of each taken from a warm-up set (the
    warm-up's inputs, shuffled so no batch repeats one earlier batch whole), and the warm-up
    set itself."""
    rng = random.Random(seed)
    warm = [sentence(rng) for _ in range(requests * seen)]
    order = warm[:]
    rng.shuffle(order)
    measured = []
    for i in range(requests):
        part = order[i * seen : (i + 1) * seen] + [sentence(rng) for _ in range(batch - seen)]
        rng.shuffle(part)
        measured.append(part)
    return measured, warm


async def send_all(
    url: str, inputs: list[list[str]], concurrency: int, model: str
) -> dict[str, Any]:
    """Every batch once, `concurrency` at a time; wall time, per-request latencies, the
    `X-Cache` answers, and the inputs each answer held."""
    queue = list(enumerate(inputs))
    latencies: list[float] = []
    caches: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while queue:
                _, batch = queue.pop(0)
                start = time.perf_counter()
                body = {"model": model, "input": batch}
                async with session.post(url, json=body) as response:
                    answer = await response.json()
                    if response.status != 200:
                        raise SystemExit(f"{url}: {response.status} {answer}")
                latencies.append(time.perf_counter() - start)
                if len(answer["data"]) != len(batch):
                    raise SystemExit(f"{url}: {len(answer['data'])} vectors for {len(batch)}")
                cache = response.headers.get("x-cache", "-")
                caches[cache] = caches.get(cache, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "requests": len(inputs),
        "inputs": sum(len(b) for b in inputs),
        "latencies": latencies,
        "x_cache": caches,
    }


def server_command(kind: str, args: argparse.Namespace, port: int) -> list[str]:
    engine = [
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
    ]  # fmt: skip
    if kind == "vllm":
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", args.model, "--served-model-name", NAME,
            "--runner", "pooling", "--convert", "embed",
            "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
            *engine,
        ]  # fmt: skip
    return [
        sys.executable, "-m", "sluicegate", "serve",
        "--model", args.model, "--served-model-name", "smol", "--port", str(port), *engine,
    ]  # fmt: skip


def start_server(
    kind: str, args: argparse.Namespace, port: int, redis_url: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "SLUICEGATE_EMBEDDING_MODEL": args.model,
        "SLUICEGATE_EMBEDDING_SERVED_NAME": NAME,
        "SLUICEGATE_EMBEDDING_CPU_KVCACHE_SPACE_GIB": str(args.kv_cache_gib),
        "SLUICEGATE_REDIS_URL": redis_url,
        "SLUICEGATE_LOG_LEVEL": "warning",
    }
    wait_port_free(port)
    log = RESULTS / f"embeddings-{kind}-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(kind, args, port), stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
    ready = "/ready" if kind == "sluicegate" else "/health"
    wait_ready(f"http://127.0.0.1:{port}{ready}", process, f"{kind} server (see {log})", 600)
    return process


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.1)
    process.kill()
    raise SystemExit("redis-server did not start")


def scenario_inputs(
    args: argparse.Namespace, round_index: int, level: int, scenario: str
) -> tuple[list[list[str]], list[str]]:
    """Both servers get the same batches; each round, level and scenario its own."""
    seed = 10_000 * round_index + 100 * level + (1 if scenario == "seen" else 2)
    seen = round(args.batch * SEEN_SHARE) if scenario == "seen" else 0
    return batches(seed, args.requests, args.batch, seen)


def measure(
    kind: str, port: int, args: argparse.Namespace, round_index: int, level: int
) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    figures = {}
    for scenario in ("fresh", "seen"):
        measured, warm = scenario_inputs(args, round_index, level, scenario)
        if warm:
            chunks = [warm[i : i + args.batch] for i in range(0, len(warm), args.batch)]
            asyncio.run(send_all(url, chunks, level, NAME))
        figures[scenario] = asyncio.run(send_all(url, measured, level, NAME))
    return figures


def summarize(runs: list[dict[str, Any]]) -> list[float]:
    """inputs/s (median over rounds), median and P99 request latency (pooled), in ms."""
    latencies = [t * 1000 for run in runs for t in run["latencies"]]
    return [
        statistics.median(run["inputs"] / run["wall_s"] for run in runs),
        statistics.median(latencies),
        sorted(latencies)[max(0, round(0.99 * len(latencies)) - 1)],
    ]


def table(results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int]) -> str:
    lines = [
        "| scenario | concurrency | server | inputs/s | median latency ms | P99 latency ms |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in ("fresh", "seen"):
        label = "nothing cached" if scenario == "fresh" else "90% seen before"
        for level in levels:
            figures = {
                kind: summarize([r[level][scenario] for r in runs])
                for kind, runs in results.items()
            }
            for kind, name in (("vllm", "vLLM server"), ("sluicegate", "sluicegate")):
                row = " | ".join(f"{v:.0f}" if v >= 100 else f"{v:.1f}" for v in figures[kind])
                lines.append(f"| {label} | {level} | {name} | {row} |")
            ratios = [s / v for s, v in zip(figures["sluicegate"], figures["vllm"], strict=True)]
            lines.append(
                f"| {label} | {level} | **ratio** | "
                + " | ".join(f"**{r:.2f}x**" for r in ratios)
                + " |"
            )
    caches = []
    for level in levels:
        for scenario in ("fresh", "seen"):
            seen = [r[level][scenario]["x_cache"] for r in results["sluicegate"]]
            caches.append(f"c={level} {scenario}: {seen}")
    return (
        "\n".join(lines) + "\n\nsluicegate's X-Cache answers, round by round: " + "; ".join(caches)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the prepared bundled SmolLM2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--batch", type=int, default=64, help="inputs per request")
    parser.add_argument("--requests", type=int, default=16, help="requests per turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--port", type=int, default=8890)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        from sluicegate.engine.model import bundled_model_dir
        from sluicegate.settings import Settings

        args.model = str(bundled_model_dir(Settings().model_cache_dir))

    ports = {kind: args.port + i for i, kind in enumerate(KINDS)}
    results: dict[str, list[dict[int, dict[str, Any]]]] = {
        kind: [{} for _ in range(args.rounds)] for kind in KINDS
    }
    processes: dict[str, subprocess.Popen[bytes]] = {}
    with tempfile.TemporaryDirectory() as folder:
        redis, redis_url = start_redis(Path(folder))
        try:
            for kind in KINDS:
                processes[kind] = start_server(kind, args, ports[kind], redis_url)
                # Warm-up: both engines' first batches (and sluicegate's Redis pool).
                warm, _ = batches(1, 4, args.batch, 0)
                url = f"http://127.0.0.1:{ports[kind]}/v1/embeddings"
                asyncio.run(send_all(url, warm, 2, NAME))
                freeze(processes[kind])
            for round_index, level, order in turns(args.rounds, args.concurrency):
                for kind in order:
                    print(f"--- round {round_index + 1}, concurrency {level}: {kind}", flush=True)
                    thaw(processes[kind], ports[kind])
                    try:
                        results[kind][round_index][level] = measure(
                            kind, ports[kind], args, round_index, level
                        )
                    finally:
                        freeze(processes[kind])
        finally:
            for process in processes.values():
                stop(process)
            redis.kill()
            redis.wait()
    publish(
        "embeddings",
        f"Machine: {machine()}; rounds: {args.rounds}; {args.requests} requests of "
        f"{args.batch} inputs (30 to 50 words each) per turn",
        results,
        table(results, args.concurrency),
    )


if __name__ == "__main__":
    main()
