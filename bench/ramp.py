"""Staged load test, the same as bench/k6/loadtest.js, for machines without k6.

Concurrency steps up to a peak (4, 8, 12, 16 by default, from bench/k6/workload.json); each
step ramps in 15 s and holds 75 s, so the steps hold 5 minutes in all. Each virtual user
loops over chat completions drawn from the workload's prompt mix (short questions,
questions over documents, multi-turn conversations), half of them streamed; a fifth are
repeats at temperature 0, which the response cache may answer, the rest at temperature 0.7,
which it does not cache by default. Per step it
prints QPS (completed requests per second), P50/P95/P99 latency of whole requests, P50 time
to the first event of streamed ones, and the error count; then the errors by kind. It exits
1 when the k6 script's thresholds are crossed (P95 latency, error rate).

    .venv/bin/python bench/ramp.py                              # 6 minutes, peak 16
    .venv/bin/python bench/ramp.py --scale 0.1 --peak 8         # a 36 s smoke run
    .venv/bin/python bench/ramp.py --base-url https://gw.example --api-key "$KEY" --peak 128

Requests still running when the ramp ends are cancelled, not counted. The load generator
shares the machine with the server when both run on one host: compare runs made alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WORKLOAD = Path(__file__).resolve().parent / "k6" / "workload.json"
ERROR_PAUSE_S = 0.1


@dataclass
class Step:
    concurrency: int
    start: float  # seconds from the start of the run
    ramp: float
    end: float
    latencies: list[float] = field(default_factory=list)
    first_events: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Outcome:
    latency: float
    first_event: float | None = None
    error: str | None = None


def plan(workload: dict[str, Any], peak: int, scale: float) -> list[Step]:
    ramp = workload["ramp"]
    steps, clock = [], 0.0
    for fraction in ramp["steps"]:
        ramp_s, hold_s = ramp["ramp_seconds"] * scale, ramp["hold_seconds"] * scale
        concurrency = max(1, round(peak * fraction))
        steps.append(Step(concurrency, clock, ramp_s, clock + ramp_s + hold_s))
        clock += ramp_s + hold_s
    return steps


def user_start_times(steps: list[Step]) -> list[float]:
    """When each virtual user joins: spread evenly over the ramp of the step that adds it."""
    starts: list[float] = []
    for step in steps:
        added = step.concurrency - len(starts)
        starts.extend(step.start + step.ramp * (i + 1) / added for i in range(max(0, added)))
    return starts


def percentile(values: list[float], pct: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


class Runner:
    def __init__(self, args: argparse.Namespace, workload: dict[str, Any]) -> None:
        self.args = args
        self.mix = workload["mix"]
        self.temperature = float(workload["requests"]["temperature"])
        self.steps = plan(workload, args.peak, args.scale)
        self.rng = random.Random(args.seed)
        self.error_kinds: Counter[str] = Counter()
        self.t0 = 0.0
        headers = {"content-type": "application/json"}
        if args.api_key:
            headers["authorization"] = f"Bearer {args.api_key}"
        self.client = httpx.AsyncClient(
            base_url=args.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(args.timeout, connect=10),
            limits=httpx.Limits(max_connections=args.peak, max_keepalive_connections=args.peak),
        )

    async def run(self) -> None:
        self.t0 = time.monotonic()
        end = self.steps[-1].end
        users = [
            asyncio.create_task(self.user(start, end)) for start in user_start_times(self.steps)
        ]
        await asyncio.sleep(end)
        for task in users:
            task.cancel()
        await asyncio.gather(*users, return_exceptions=True)
        await self.client.aclose()

    async def user(self, start: float, end: float) -> None:
        await asyncio.sleep(start)
        while time.monotonic() - self.t0 < end:
            outcome = await self.request()
            self.record(outcome)
            if outcome.error is not None:
                await asyncio.sleep(ERROR_PAUSE_S)  # a refused request must not spin the loop

    def record(self, outcome: Outcome) -> None:
        now = time.monotonic() - self.t0
        step = next((s for s in self.steps if now < s.end), self.steps[-1])
        if outcome.error is not None:
            step.errors += 1
            self.error_kinds[outcome.error] += 1
            return
        step.latencies.append(outcome.latency)
        if outcome.first_event is not None:
            step.first_events.append(outcome.first_event)

    def body(self) -> dict[str, Any]:
        kind = self.rng.choices(self.mix, weights=[k["weight"] for k in self.mix])[0]
        repeat = self.rng.random() < self.args.repeat_share
        return {
            "model": self.args.model,
            "messages": self.rng.choice(kind["conversations"]),
            "max_tokens": self.args.max_tokens,
            "temperature": 0.0 if repeat else self.temperature,
            "stream": self.rng.random() < self.args.stream_share,
        }

    async def request(self) -> Outcome:
        body = self.body()
        started = time.monotonic()
        try:
            if body["stream"]:
                return await self.streamed(body, started)
            response = await self.client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                return Outcome(0, error=_status_error(response))
            if "message" not in response.json()["choices"][0]:
                return Outcome(0, error="malformed response")
            return Outcome(time.monotonic() - started)
        except httpx.HTTPError as exc:
            return Outcome(0, error=type(exc).__name__)
        except (ValueError, KeyError, IndexError, TypeError):
            return Outcome(0, error="malformed response")

    async def streamed(self, body: dict[str, Any], started: float) -> Outcome:
        first_event = None
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return Outcome(0, error=_status_error(response))
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if first_event is None:
                    first_event = time.monotonic() - started
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    return Outcome(time.monotonic() - started, first_event)
                if "error" in json.loads(data):
                    return Outcome(0, error="error event in stream")
        return Outcome(0, error="stream ended without [DONE]")


def _status_error(response: httpx.Response) -> str:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return f"HTTP {response.status_code}" + (f" {code}" if code else "")


def report(runner: Runner) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = [
        "| step | users | seconds | requests | QPS | P50 ms | P95 ms | P99 ms "
        "| stream first event P50 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, step in enumerate(runner.steps, 1):
        done = len(step.latencies)
        cells = [
            str(number),
            str(step.concurrency),
            f"{step.seconds:.0f}",
            str(done),
            f"{done / step.seconds:.2f}",
            ms(percentile(step.latencies, 50)),
            ms(percentile(step.latencies, 95)),
            ms(percentile(step.latencies, 99)),
            ms(percentile(step.first_events, 50)),
            str(step.errors),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if runner.error_kinds:
        kinds = ", ".join(f"{kind}: {n}" for kind, n in runner.error_kinds.most_common())
        lines.append(f"\nerrors by kind: {kinds}")
    return "\n".join(lines)


def thresholds_crossed(runner: Runner, p95_ms: float, max_error_rate: float) -> list[str]:
    """The k6 script's thresholds, over the whole run: P95 latency and the error rate."""
    latencies = [latency for step in runner.steps for latency in step.latencies]
    errors = sum(step.errors for step in runner.steps)
    crossed = []
    p95 = percentile(latencies, 95)
    if p95 is not None and p95 * 1000 >= p95_ms:
        crossed.append(f"P95 {p95 * 1000:.0f} ms >= {p95_ms:.0f} ms")
    total = len(latencies) + errors
    if total == 0:
        crossed.append("no request completed")
    elif errors / total >= max_error_rate:
        crossed.append(f"error rate {errors / total:.3f} >= {max_error_rate}")
    return crossed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    workload = json.loads(WORKLOAD.read_text())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None, help="sent as a bearer token if given")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument(
        "--peak", type=int, default=workload["ramp"]["peak"], help="users at the last step"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplies every duration (0.1: a 36 s run)"
    )
    defaults = workload["requests"]
    parser.add_argument("--max-tokens", type=int, default=defaults["max_tokens"])
    parser.add_argument(
        "--stream-share", type=float, default=defaults["stream_share"], help="streamed share"
    )
    parser.add_argument(
        "--repeat-share",
        type=float,
        default=defaults["repeat_share"],
        help="share sent at temperature 0 (cacheable repeats)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=None, help="for a repeatable request mix")
    parser.add_argument("--p95-ms", type=float, default=20000.0, help="P95 latency threshold")
    parser.add_argument("--max-error-rate", type=float, default=0.01, help="error threshold")
    args = parser.parse_args(argv)
    if args.peak < 1 or args.scale <= 0:
        parser.error("--peak must be at least 1 and --scale above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runner = Runner(args, json.loads(WORKLOAD.read_text()))
    total = runner.steps[-1].end
    steps = ", ".join(str(step.concurrency) for step in runner.steps)
    print(f"ramp: {steps} users over {total:.0f} s against {args.base_url}", file=sys.stderr)
    asyncio.run(runner.run())
    print(report(runner))
    crossed = thresholds_crossed(runner, args.p95_ms, args.max_error_rate)
    for line in crossed:
        print(f"threshold crossed: {line}")
    return 1 if crossed else 0


if __name__ == "__main__":
    sys.exit(main())
