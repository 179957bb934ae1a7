"""Latency probes: the figures the tests once asserted, measured and reported instead.

The tests bound time only where a stall would be a failure a user sees, with room for a
loaded machine (issue 29); how fast things are is measured here:

- `/health` while a hostile body is worked on (`tests/integration/test_loop_lag.py`'s
  bodies, one gateway with the real engine): a probe every 50 ms from a process of its own,
  per body its wait's median, P99 and max, and the gateway's own loop-lag samples over
  100 ms (`sluicegate_event_loop_lag_seconds`);
- refusals under overload (`tests/integration/test_overload.py`'s flood: 80 requests at
  once on plain sockets against `MAX_IN_FLIGHT=8`): their time from the client and in the
  gateway (its JSON access lines), median, P99 and max over all rounds;
- near-cache invalidation (`tests/unit/cache/test_invalidation.py`'s two gateways, fake
  engine, real HTTP, a Redis of their own): how long the other gateway still answers the
  old entry after it is replaced through one gateway, or deleted in Redis.

    .venv/bin/python bench/latency_probes.py                       # all three
    .venv/bin/python bench/latency_probes.py --only invalidation --invalidation-rounds 200
    .venv/bin/python bench/latency_probes.py --doc                 # and docs/benchmarks/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.gateway import MODEL_NAME, GatewayProcess, start_gateway  # noqa: E402

PROBES = ("health", "refusals", "invalidation")
ADMITTED = 8
FLOOD = 10 * ADMITTED


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def row(probe: str, what: str, seconds: Sequence[float], note: str = "") -> dict[str, Any]:
    """One line of the table: count, median, P99 and max of `seconds`, in ms."""
    if not seconds:
        return {"probe": probe, "what": what, "count": 0, "note": note}
    return {
        "probe": probe,
        "what": what,
        "count": len(seconds),
        "median_ms": statistics.median(seconds) * 1000,
        "p99_ms": quantile(seconds, 0.99) * 1000,
        "max_ms": max(seconds) * 1000,
        "note": note,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| probe | what | n | median ms | P99 ms | max ms | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        figures = [f"{r[k]:.1f}" if k in r else "-" for k in ("median_ms", "p99_ms", "max_ms")]
        lines.append(
            f"| {r['probe']} | {r['what']} | {r['count']} | {' | '.join(figures)} | {r['note']} |"
        )
    return "\n".join(lines)


# ---- /health under hostile bodies ----------------------------------------------------------


def lag_over(url: str, bound: str) -> float:
    """How many of the gateway's loop-lag samples so far were above `bound` seconds."""
    from tests.integration.test_loop_lag import lag_buckets

    buckets = lag_buckets(url)
    return buckets["+Inf"] - buckets[bound]


def probe_health(gateway: GatewayProcess, rounds: int, folder: Path) -> list[dict[str, Any]]:
    from tests.integration.test_loop_lag import PROBE, PROBE_EVERY_S, hostile_bodies

    rows = []
    for name, path, body in hostile_bodies():
        payload = json.dumps({"model": MODEL_NAME, "max_tokens": 1, **body}).encode()
        body_file = folder / "body.json"
        body_file.write_bytes(payload)
        send = (
            f"import httpx; r = httpx.post({gateway.url + path!r}, "
            f"content=open({str(body_file)!r}, 'rb').read(), "
            "headers={'content-type': 'application/json'}, timeout=600); print(r.status_code)"
        )
        waits: list[float] = []
        statuses = set()
        lag_before = lag_over(gateway.url, "0.1")
        for _ in range(rounds):
            stop = folder / "stop"
            stop.unlink(missing_ok=True)
            with subprocess.Popen(
                [sys.executable, "-c", PROBE, gateway.url, str(stop), str(PROBE_EVERY_S)],
                stdout=subprocess.PIPE,
                text=True,
            ) as prober:
                assert prober.stdout is not None and prober.stdout.readline().strip() == "probing"
                began = time.monotonic()
                sent = subprocess.run([sys.executable, "-c", send], capture_output=True, text=True)
                ended = time.monotonic()
                stop.touch()
                probes = json.loads(prober.stdout.read())
            statuses.add(sent.stdout.strip() or sent.stderr[-200:])
            waits += [wait for at, wait, _ in probes if at <= ended and at + wait >= began]
        stalls = lag_over(gateway.url, "0.1") - lag_before
        note = f"answered {'/'.join(sorted(statuses))}; loop-lag samples > 100 ms: {stalls:g}"
        rows.append(row("/health under a hostile body", name, waits, note))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


# ---- refusals under overload ---------------------------------------------------------------


async def flood(url: str) -> list[tuple[int, float]]:
    """FLOOD chat requests at once on sockets connected first: each one's status and time."""
    payload = json.dumps({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Write about the sea."}],
        "max_tokens": 16, "ignore_eos": True,
    }).encode()  # fmt: skip
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(payload)
    ) + payload
    host, port = url.removeprefix("http://").split(":")
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(FLOOD)]

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, float]:
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        elapsed = time.perf_counter() - started
        await reader.read(-1)
        writer.close()
        return int(head.split(b" ", 2)[1]), elapsed

    return await asyncio.gather(*(one(r, w) for r, w in connections))


def probe_refusals(gateway: GatewayProcess, rounds: int) -> list[dict[str, Any]]:
    from tests.integration.test_overload import refusal_times

    client: list[float] = []
    server: list[float] = []
    admitted = 0
    for _ in range(rounds):
        log_start = len(gateway.log())
        results = asyncio.run(flood(gateway.url))
        refused = [t for status, t in results if status == 503]
        admitted += sum(status == 200 for status, _ in results)
        client += refused
        server += [ms / 1000 for ms in refusal_times(gateway, log_start, len(refused))]
    note = f"{rounds} floods of {FLOOD} at MAX_IN_FLIGHT={ADMITTED}; {admitted} admitted"
    return [
        row("refusal under overload", "from the client", client, note),
        row("refusal under overload", "in the gateway (access log)", server, note),
    ]


# ---- near-cache invalidation ---------------------------------------------------------------


async def invalidations(rounds: int, folder: Path) -> list[dict[str, Any]]:
    import redis
    from tests.support.fakes import FakeEngine, fake_app, greedy_chat, serve_in_thread
    from tests.support.redis_server import running_redis
    from tests.unit.cache.test_invalidation import (
        MAX_LAG,
        PREFIX,
        Gateway,
        entries,
        first_change,
        near_hit_on,
    )

    replaced: list[float] = []
    deleted: list[float] = []
    with running_redis(folder) as server:
        raw = redis.Redis(port=server.port, socket_timeout=5)
        settings = {"redis_url": server.url, "redis_key_prefix": PREFIX,
                    "cache_near_max_lag": MAX_LAG}  # fmt: skip
        async with AsyncExitStack() as stack:
            gateways = []
            for _ in range(2):
                engine = FakeEngine(words=["Hello", " there"])
                url = stack.enter_context(serve_in_thread(fake_app(engine, **settings)))
                client = await stack.enter_async_context(httpx.AsyncClient(base_url=url))
                gateways.append(Gateway(client, engine))
            a, b = gateways
            for i in range(rounds):
                body, old, new = greedy_chat(f"round {i}"), f"Old {i}", f"New {i}"
                a.engine.words = b.engine.words = [old]
                await a.ask(body)
                await near_hit_on(b, body)
                a.engine.words = b.engine.words = [new]
                await a.ask(body, **{"cache-control": "no-cache"})  # replaced through A
                replaced.append(await first_change(b, body, old))
                a.engine.words = b.engine.words = [old]
                await a.ask(body, **{"cache-control": "no-cache"})
                held = await near_hit_on(b, body)
                for _ in range(1000):  # until B's near cache holds the old one again
                    if held == old:
                        break
                    held = await near_hit_on(b, body)
                raw.delete(*entries(raw))  # deleted behind both gateways' backs
                deleted.append(await first_change(b, body, old))
        raw.close()
    note = "the other gateway's first answer that is not the old entry"
    return [
        row("near-cache invalidation", "replaced through the other gateway", replaced, note),
        row("near-cache invalidation", "deleted in Redis", deleted, note),
    ]


# ---- the run -------------------------------------------------------------------------------


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    import os

    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def document(rows: Sequence[dict[str, Any]], command: str, load: str) -> str:
    return "\n".join([
        f"# {time.strftime('%Y-%m-%d')}: latency probes",
        "",
        "The figures the tests no longer assert (issue 29), from `bench/latency_probes.py`.",
        "",
        f"- **Date:** {time.strftime('%Y-%m-%d %H:%M %Z')}.",
        f"- **Machine:** {machine()}; load average {load} at the start.",
        f"- **Command:** `{command}`.",
        "",
        table(rows),
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=PROBES, default=list(PROBES))
    parser.add_argument("--health-rounds", type=int, default=1, help="sends of each body")
    parser.add_argument("--refusal-rounds", type=int, default=5, help="floods")
    parser.add_argument("--invalidation-rounds", type=int, default=100)
    parser.add_argument("--doc", action="store_true",
                        help="also write docs/benchmarks/<date>-latency-probes.md")  # fmt: skip
    args = parser.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    folder = Path(tempfile.mkdtemp(prefix="latency-probes-"))
    rows: list[dict[str, Any]] = []
    if "invalidation" in args.only:
        rows += asyncio.run(invalidations(args.invalidation_rounds, folder))
        print(table(rows), flush=True)
    if {"health", "refusals"} & set(args.only):
        env = {
            "SLUICEGATE_MAX_IN_FLIGHT": str(ADMITTED),
            "SLUICEGATE_MAX_CONNECTIONS": "100",
            "SLUICEGATE_LOG_FORMAT": "json",
        }
        gateway = start_gateway(folder, env=env)
        try:
            if "refusals" in args.only:
                rows += probe_refusals(gateway, args.refusal_rounds)
            if "health" in args.only:
                rows += probe_health(gateway, args.health_rounds, folder)
        finally:
            gateway.stop()
    print(f"\nlatency probes ({machine()}, load {load})\n")
    print(table(rows))
    if args.doc:
        command = "python bench/latency_probes.py " + " ".join(sys.argv[1:])
        out = ROOT / "docs" / "benchmarks" / f"{time.strftime('%Y-%m-%d')}-latency-probes.md"
        out.write_text(document(rows, command.strip(), load))
        print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
