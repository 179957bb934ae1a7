"""What a budgeted key and the usage ledger cost on the cache-hit path, paired in one run.

Four gateways in upstream mode (over the fault upstream; every request is a cache hit once
seeded), all with managed keys and Redis: `plain`, the usage ledger off and a key without a
budget; `control`, the same again (how far two identical processes differ); `ledger`, the
ledger on and the same key; `budgeted`, the ledger on and a key with a budget (tokens per
day, far from used up). wrk drives each in turn with the same cached
prompts, the order turned round each round. Reported:
req/s and latency of each, the ratio, and whether the ledger kept up: after the run, the
ledger's request count must equal what the gateway served (read from its metrics), and the
batches it took. Then how long a change takes to reach another replica: `plain` has a second
replica on the same Redis keys (`replica`, idle during the rounds); a key created on `plain`
is polled on `replica` until it answers 200, and revoked on `replica`, polled on `plain` until
it answers 401 (every 10 ms; `--changes` times each).

    .venv/bin/python bench/keys.py --rounds 4 --duration 8

Needs `wrk` and a Redis (`--redis-url`).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cache_hits import wrk  # noqa: E402
from tests.support.fault_upstream import start as start_upstream  # noqa: E402
from tests.support.gateway import GatewayProcess, start_gateway  # noqa: E402
from tests.support.metrics import scrape, total  # noqa: E402

ADMIN = "sk-bench-admin"
VARIANTS = ("plain", "control", "ledger", "budgeted")
"""`control` is `plain` again, a process of its own: how far two identical gateways differ."""
MODEL = "fault-model"


def payloads(count: int, tag: str) -> list[str]:
    return [
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Name a river ({tag}-{i})."}],
                "temperature": 0,
                "max_tokens": 16,
            }
        )
        for i in range(count)
    ]


def create_key(gateway: GatewayProcess, **settings: object) -> dict[str, str]:
    answer = httpx.post(
        f"{gateway.url}/admin/keys",
        json=settings,
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    answer.raise_for_status()
    return dict(answer.json())


def seed(gateway: GatewayProcess, key: str, bodies: list[str]) -> None:
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        for body in bodies:
            for _ in range(50):
                r = client.post(
                    "/v1/chat/completions",
                    content=body,
                    headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
                )
                r.raise_for_status()
                if r.headers.get("x-cache") == "HIT":
                    break
                time.sleep(0.05)


def ledger_requests(gateway: GatewayProcess, key_id: str) -> int:
    answer = httpx.get(
        f"{gateway.url}/admin/usage",
        params={"key_id": key_id},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=60,
    )
    answer.raise_for_status()
    return int(answer.json()["totals"]["requests"])


def _first(check: Callable[[], bool], limit: float = 30.0) -> float:
    """Seconds until `check` holds, asked every 10 ms."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > limit:
            raise RuntimeError(f"no change after {limit} s")
        time.sleep(0.01)
    return time.monotonic() - start


def propagation(a: GatewayProcess, b: GatewayProcess, changes: int) -> dict[str, list[float]]:
    """Seconds from a key's creation on `a` to its first 200 on `b`, and from its revocation
    on `b` to its first 401 on `a`, for `changes` keys."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    times: dict[str, list[float]] = {"created": [], "revoked": []}
    with httpx.Client(timeout=30) as client:

        def answers(gateway: GatewayProcess, secret: str, status: int) -> bool:
            reply = client.get(
                gateway.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}
            )
            return reply.status_code == status

        for i in range(changes):
            # At a random moment of the replicas' polls (each polls at its own fixed pace).
            time.sleep(random.uniform(0, 0.25))
            made = client.post(a.url + "/admin/keys", json={"name": f"moved-{i}"}, headers=admin)
            made.raise_for_status()
            secret, key_id = made.json()["key"], made.json()["id"]
            times["created"].append(_first(functools.partial(answers, b, secret, 200)))
            time.sleep(random.uniform(0, 0.25))
            client.delete(f"{b.url}/admin/keys/{key_id}", headers=admin).raise_for_status()
            times["revoked"].append(_first(functools.partial(answers, a, secret, 401)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    logs = ROOT / "bench" / "results" / "keys"
    logs.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    upstream = start_upstream(0, "--chunks", "16", "--tokenize", log=logs / "up.log")
    gateways: dict[str, GatewayProcess] = {}
    try:
        ledgers = {"plain": "false", "control": "false", "ledger": "true", "budgeted": "true"}
        for name, ledger in {**ledgers, "replica": "false"}.items():
            prefix = "plain" if name == "replica" else name
            gateways[name] = start_gateway(
                logs,
                env={
                    "SLUICEGATE_UPSTREAM_URLS": upstream.url,
                    "SLUICEGATE_REDIS_URL": args.redis_url,
                    "SLUICEGATE_REDIS_KEY_PREFIX": f"bench-keys-{run}-{prefix}",
                    "SLUICEGATE_MANAGED_KEYS": "true",
                    "SLUICEGATE_ADMIN_API_KEYS": ADMIN,
                    "SLUICEGATE_USAGE_LEDGER": ledger,
                    "SLUICEGATE_LOG_LEVEL": "warning",
                },
            )
        keys = {
            "plain": create_key(gateways["plain"], name="plain"),
            "control": create_key(gateways["control"], name="plain"),
            "ledger": create_key(gateways["ledger"], name="plain"),
            "budgeted": create_key(
                gateways["budgeted"],
                name="budgeted",
                budget={"tokens": 10**12, "period": "day"},
            ),
        }
        bodies = payloads(32, run)
        for name in VARIANTS:
            seed(gateways[name], keys[name]["key"], bodies)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
            for name in order:
                process = psutil.Process(gateways[name].process.pid)
                cpu = sum(process.cpu_times()[:2])
                url = gateways[name].url + "/v1/chat/completions"
                measured = wrk(url, bodies, args.concurrency, args.duration, keys[name]["key"])
                spent = sum(process.cpu_times()[:2]) - cpu
                measured["cpu_us"] = spent / measured["requests"] * 1e6
                results[name].append(measured)
                print(f"round {round_ + 1}: {name}: {measured['rps']:.0f} req/s", flush=True)
        budgeted = gateways["budgeted"]
        time.sleep(1.0)  # a flush interval, and then some
        in_ledger = ledger_requests(budgeted, keys["budgeted"]["id"])
        samples = scrape(budgeted.url)
        served = int(total(samples, "sluicegate_key_requests_total"))
        batches = total(samples, "sluicegate_usage_batches_total", outcome="written")
        lost = total(samples, "sluicegate_usage_lost_total", measure="requests")
        moved = propagation(gateways["plain"], gateways["replica"], args.changes)
        report(results, served, in_ledger, batches, lost, args)
        for change, seconds in moved.items():
            print(
                f"key {change} on one replica, seen by the other: median "
                f"{statistics.median(seconds) * 1000:.0f} ms, slowest {max(seconds) * 1000:.0f} "
                f"ms of {len(seconds)} (target: within 1 s)"
            )
    finally:
        for gateway in gateways.values():
            gateway.stop()
        upstream.stop()


def report(
    results: dict[str, list[dict[str, float]]],
    served: int,
    in_ledger: int,
    batches: float,
    lost: float,
    args: argparse.Namespace,
) -> None:
    def median(name: str, field: str) -> float:
        return statistics.median(m[field] for m in results[name])

    print(f"\n{args.rounds} rounds of {args.duration} s at concurrency {args.concurrency}\n")
    print(
        "| gateway and key | req/s (median) | each round | CPU µs per request | P50 ms | P99 ms |"
    )
    print("|---|---|---|---|---|---|")
    for name in VARIANTS:
        rounds = ", ".join(f"{m['rps']:.0f}" for m in results[name])
        print(
            f"| {name} | {median(name, 'rps'):.0f} | {rounds} | {median(name, 'cpu_us'):.1f} | "
            f"{median(name, 'p50'):.2f} | {median(name, 'p99'):.2f} |"
        )
    print()
    for name in VARIANTS[1:]:
        pairs = zip(results["plain"], results[name], strict=True)
        ratios = [b["rps"] / p["rps"] for p, b in pairs]
        print(
            f"{name} / plain, per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.3f} (target for budgeted: >= 0.97)"
        )
    print(
        f"ledger: {in_ledger} requests recorded of {served} served ({lost:.0f} lost), in "
        f"{batches:.0f} batches; busiest round {max(m['rps'] for m in results['budgeted']):.0f} "
        "settled requests/s"
    )


if __name__ == "__main__":
    main()
