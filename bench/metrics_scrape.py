"""What `/metrics` costs the gateway when an endpoint picker scrapes it every 50 ms.

The Gateway API inference extension's endpoint picker (llm-d's router) polls each model
server's `/metrics` every 50 ms by default, 20 scrapes a second per pod, for
`vllm:num_requests_waiting`, `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`.
This starts one real gateway (the bundled model, the engine's `vllm:*` series on), sends it
a little traffic of each kind so its series have their usual label sets, then alternates
two kinds of window of the same length, A-B-B-A:

- **idle**: nobody scrapes;
- **scraped**: one keep-alive client GETs `/metrics` on a fixed 50 ms tick.

In each window it reads the CPU time of the gateway process and of its children (the engine
core) from /proc (psutil), and a second client asks `/health` every 100 ms: its latency is
what a scrape costs everyone else while it renders. The scrape's CPU cost is the difference
between the two kinds, per second and per scrape; the clients run in this process, so their
own CPU is not counted. The environment is passed on to the gateway, so
`PROMETHEUS_DISABLE_CREATED_SERIES=true` measures the exposition without its `_created`
series.

It does so for two variants of the gateway, one after the other:

- **shipped**: `/metrics` as it is (`observability/exposition.py`: rendered in a worker
  thread, one render shared by the scrapes that arrive during it), then `/metrics/engine`
  (the few series an endpoint picker reads) on the same gateway;
- **on-loop**: the registry rendered in the handler, on the event loop, as before.

    .venv/bin/python bench/metrics_scrape.py                 # 2 pairs of 15 s windows each
    .venv/bin/python bench/metrics_scrape.py --pairs 3 --window 20 --variants shipped
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from compare_vllm import RESULTS, cpu_seconds, machine, publish, stop, wait_ready

VARIANTS = ("shipped", "on-loop")
# What each variant's gateway is scraped at: the full exposition, and (shipped) the engine's
# scheduling state alone, which an endpoint picker can be pointed at.
PATHS = {"shipped": ("/metrics", "/metrics/engine"), "on-loop": ("/metrics",)}
WARMUP_BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
    {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 8, "stream": True},
    {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "n": 2},
]


def warm_up(url: str, model: str) -> None:
    """Traffic of each kind, so the histograms and counters carry their usual label sets."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for body in WARMUP_BODIES:
            client.post("/v1/chat/completions", json={"model": model, **body})
        client.post("/v1/completions", json={"model": model, "prompt": "Once", "max_tokens": 4})
        client.post("/v1/chat/completions", json={"model": "no-such-model", "messages": []})
        client.get("/v1/models")


def probe(url: str, stop_at: float, latencies: list[float]) -> None:
    """`/health` every 100 ms until `stop_at`: how long the event loop makes others wait."""
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            client.get("/health").raise_for_status()
            latencies.append(time.perf_counter() - sent)
            time.sleep(0.1)


def window(
    url: str, path: str, process: psutil.Process, seconds: float, rate: float | None
) -> dict[str, Any]:
    """One window: CPU used by the gateway (and its children), the scrapes, the probes."""
    latencies: list[float] = []
    probes: list[float] = []
    sizes: list[int] = []
    own0, children0 = cpu_seconds(process)
    start = time.perf_counter()
    prober = threading.Thread(target=probe, args=(url, start + seconds, probes))
    prober.start()
    with httpx.Client(base_url=url, timeout=5) as client:
        if rate is None:
            time.sleep(seconds)
        else:
            tick = 1.0 / rate
            next_at = start
            while (now := time.perf_counter()) - start < seconds:
                if now < next_at:
                    time.sleep(next_at - now)
                sent = time.perf_counter()
                response = client.get(path)
                latencies.append(time.perf_counter() - sent)
                response.raise_for_status()
                sizes.append(len(response.content))
                next_at += tick
    prober.join()
    elapsed = time.perf_counter() - start
    own1, children1 = cpu_seconds(process)
    return {
        "kind": "idle" if rate is None else "scraped",
        "elapsed": elapsed,
        "own_cpu": own1 - own0,
        "children_cpu": children1 - children0,
        "scrapes": len(latencies),
        "latencies": latencies,
        "probes": probes,
        "bytes": statistics.median(sizes) if sizes else 0,
    }


def series_count(url: str, path: str) -> tuple[int, int]:
    """(samples, metric families named vllm:*) in one exposition."""
    text = httpx.get(f"{url}{path}", timeout=5).text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    vllm = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE vllm:")}
    return len(samples), len(vllm)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report(windows: list[dict[str, Any]], samples: int, vllm_families: int, rate: float) -> str:
    def per_second(kind: str, key: str) -> float:
        chosen = [w for w in windows if w["kind"] == kind]
        return sum(w[key] for w in chosen) / sum(w["elapsed"] for w in chosen)

    scraped = [w for w in windows if w["kind"] == "scraped"]
    scrapes = sum(w["scrapes"] for w in scraped)
    scrape_seconds = sum(w["elapsed"] for w in scraped)
    latencies = [lat for w in scraped for lat in w["latencies"]]
    probes = {
        kind: [lat for w in windows if w["kind"] == kind for lat in w["probes"]]
        for kind in ("idle", "scraped")
    }
    idle_own, scraped_own = per_second("idle", "own_cpu"), per_second("scraped", "own_cpu")
    idle_kids = per_second("idle", "children_cpu")
    scraped_kids = per_second("scraped", "children_cpu")
    cost_per_scrape_ms = (scraped_own - idle_own) * scrape_seconds / scrapes * 1000
    lines = [
        f"Target rate {rate:g} scrapes/s; achieved "
        f"{scrapes / scrape_seconds:.1f}/s. One exposition: {samples} samples, "
        f"{vllm_families} `vllm:*` families, {scraped[0]['bytes'] / 1024:.0f} KiB.",
        "",
        "| window | gateway process CPU (% of a core) | engine core and other children (%) |",
        "|---|---|---|",
        f"| idle | {idle_own * 100:.1f} | {idle_kids * 100:.1f} |",
        f"| scraped | {scraped_own * 100:.1f} | {scraped_kids * 100:.1f} |",
        f"| **scraped − idle** | **{(scraped_own - idle_own) * 100:.1f}** | "
        f"{(scraped_kids - idle_kids) * 100:.1f} |",
        "",
        "| per scrape | value |",
        "|---|---|",
        f"| gateway CPU | {cost_per_scrape_ms:.2f} ms |",
        f"| latency P50 | {percentile(latencies, 0.5) * 1000:.2f} ms |",
        f"| latency P99 | {percentile(latencies, 0.99) * 1000:.2f} ms |",
        f"| latency max | {max(latencies) * 1000:.2f} ms |",
        "",
        "| `/health` beside them | P50 | P99 | max |",
        "|---|---|---|---|",
        *(
            f"| {kind} | {percentile(probes[kind], 0.5) * 1000:.2f} ms | "
            f"{percentile(probes[kind], 0.99) * 1000:.2f} ms | {max(probes[kind]) * 1000:.2f} ms |"
            for kind in ("idle", "scraped")
        ),
        "",
        "| window | kind | seconds | scrapes | gateway CPU s | children CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for number, w in enumerate(windows, 1):
        lines.append(
            f"| {number} | {w['kind']} | {w['elapsed']:.1f} | {w['scrapes']} | "
            f"{w['own_cpu']:.2f} | {w['children_cpu']:.2f} |"
        )
    return "\n".join(lines)


def serve_variant(variant: str, argv: list[str]) -> int:
    """`sluicegate serve`, with `/metrics` rendered on the event loop for `on-loop`."""
    from prometheus_client import generate_latest

    from sluicegate.cli import main as sluicegate_main
    from sluicegate.observability.exposition import Exposition

    if variant == "on-loop":

        async def render(self: Exposition) -> bytes:
            return generate_latest(self._registry)

        Exposition.render = render  # type: ignore[method-assign]
    return sluicegate_main(argv)


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "SLUICEGATE_CPU_KVCACHE_SPACE_GIB": "2",
        "SLUICEGATE_MAX_MODEL_LEN": "2048",
        "SLUICEGATE_LOG_LEVEL": "warning",
    }
    url = f"http://127.0.0.1:{args.port}"
    log = Path(tempfile.mkdtemp(prefix="metrics-scrape-")) / f"gateway-{variant}.log"
    serve = ["serve", "--port", str(args.port)]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", variant, "--", *serve],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_ready(f"{url}/ready", server, f"the gateway (log: {log})", 420)
        warm_up(url, "SmolLM2-135M-Instruct")
        time.sleep(2)  # let the engine's last stats arrive
        process = psutil.Process(server.pid)
        results = {}
        for path in PATHS[variant]:
            windows = []
            for _ in range(args.pairs):
                for rate in (None, args.rate, args.rate, None):
                    windows.append(window(url, path, process, args.window, rate))
            samples, families = series_count(url, path)
            results[path] = {"windows": windows, "samples": samples, "vllm_families": families}
    finally:
        stop(server)
    return results


def main() -> int:
    if "--serve" in sys.argv:  # the gateway of one variant, started by `measure`
        at = sys.argv.index("--serve")
        return serve_variant(sys.argv[at + 1], sys.argv[at + 3 :])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="A-B-B-A pairs of windows")
    parser.add_argument("--window", type=float, default=15.0, help="seconds per window")
    parser.add_argument("--rate", type=float, default=20.0, help="scrapes per second")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()

    results = {variant: measure(variant, args) for variant in args.variants}
    created = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "")
    sections = [
        f"`PROMETHEUS_DISABLE_CREATED_SERIES={created}`. Machine: {machine()}, load average "
        f"{os.getloadavg()[0]:.1f} at the end."
    ]
    for variant, paths in results.items():
        for path, result in paths.items():
            sections.append(f"### {variant}, `{path}`\n")
            sections.append(
                report(result["windows"], result["samples"], result["vllm_families"], args.rate)
            )
    RESULTS.mkdir(exist_ok=True)
    publish(
        "metrics-scrape",
        "## /metrics at 20 scrapes per second",
        results,
        "\n\n".join(sections),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
