"""Goodput under overload: sluicegate with a TTFT objective against vLLM's server, open loop.

Both servers run the same model and engine flags as `compare_vllm.py`; sluicegate runs with
`SLUICEGATE_TTFT_OBJECTIVE` set to `--objective`. The engine's capacity is measured first,
as vLLM's server's request throughput at concurrency 32 (closed loop, the same requests).
Then each server in turn (the order alternating between load levels) gets Poisson arrivals
at `--multiples` of that capacity for `--duration` seconds: streamed chat requests of about
128 prompt tokens and 64 output tokens (`ignore_eos`), sampled at temperature 0.8, each with
its own random words, so the prefix cache does not help. A request is given up after
`--max-wait` seconds. Reported per level and server:

- goodput: requests that finished whole with a first token within the objective, per second
  of arrivals;
- P50 and P99 time to first token of the requests answered 200;
- refusals (503 or 429) and their latency, P50 and P99;
- requests given up, or failed otherwise.

    .venv/bin/python bench/goodput.py                       # 1x, 2x, 4x capacity, 30 s each
    .venv/bin/python bench/goodput.py --objective 2 --multiples 4 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from compare_vllm import RESULTS, drive, machine, parse_args, publish, start, stop

WORDS = (  # noqa: SIM905 (a list literal would take a line a word)
    "river mountain window garden silver market letter engine orange winter pencil bridge "
    "candle forest harbor ladder marble meadow needle planet rocket saddle temple valley "
    "wagon yellow anchor basket castle dragon feather glacier island jungle kettle lantern"
).split()


@dataclass(slots=True)
class Outcome:
    status: int  # 0: given up or failed before an answer
    ttft: float | None = None
    latency: float = 0.0
    complete: bool = False


def prompt(rng: random.Random, words: int) -> str:
    return "Continue this list: " + " ".join(rng.choice(WORDS) for _ in range(words))


async def one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], max_wait: float
) -> Outcome:
    started = time.perf_counter()
    outcome = Outcome(status=0)
    try:
        async with asyncio.timeout(max_wait):
            async with session.post(url, json=body) as response:
                outcome.status = response.status
                if response.status != 200:
                    await response.read()
                    return outcome
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        outcome.complete = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        break
                    choices = chunk.get("choices") or []
                    if outcome.ttft is None and choices and choices[0]["delta"].get("content"):
                        outcome.ttft = time.perf_counter() - started
    except (TimeoutError, aiohttp.ClientError):
        pass
    finally:
        outcome.latency = time.perf_counter() - started
    return outcome


async def open_loop(
    port: int, args: argparse.Namespace, rate: float, seed: int
) -> tuple[list[Outcome], float]:
    """Poisson arrivals at `rate` per second for `args.duration` seconds; every outcome."""
    rng = random.Random(seed)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=0)
    tasks: list[asyncio.Task[Outcome]] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        begun = time.perf_counter()
        at = 0.0
        while True:
            at += rng.expovariate(rate)
            if at >= args.duration:
                break
            await asyncio.sleep(max(0.0, begun + at - time.perf_counter()))
            body = {
                "model": args.name,
                "messages": [{"role": "user", "content": prompt(rng, args.prompt_words)}],
                "max_tokens": args.output_len,
                "ignore_eos": True,
                "temperature": 0.8,
                "stream": True,
            }
            tasks.append(asyncio.create_task(one(session, url, body, args.max_wait)))
        outcomes = await asyncio.gather(*tasks)
    return list(outcomes), args.duration


def summary(outcomes: list[Outcome], window: float, objective: float) -> dict[str, Any]:
    answered = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status in (429, 503)]
    good = [o for o in answered if o.complete and o.ttft is not None and o.ttft <= objective]
    ttfts = sorted(o.ttft for o in answered if o.ttft is not None)
    refusals = sorted(o.latency for o in refused)
    return {
        "sent": len(outcomes),
        "goodput": len(good) / window,
        "answered": len(answered),
        "ttft_p50": _quantile(ttfts, 0.5),
        "ttft_p99": _quantile(ttfts, 0.99),
        "refused": len(refused),
        "refusal_p50_ms": None if not refusals else _quantile(refusals, 0.5) * 1000,
        "refusal_p99_ms": None if not refusals else _quantile(refusals, 0.99) * 1000,
        "lost": len(outcomes) - len(answered) - len(refused),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def table(levels: list[dict[str, Any]], objective: float) -> str:
    lines = [
        f"| load | server | sent | goodput req/s (TTFT <= {objective:g} s) | answered "
        "| P50 TTFT s | P99 TTFT s | refused | refusal P50 / P99 ms | lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        for kind in ("vllm", "sluicegate"):
            r = level[kind]
            refusal = (
                "–" if r["refusal_p50_ms"] is None
                else f"{r['refusal_p50_ms']:.1f} / {r['refusal_p99_ms']:.1f}"
            )  # fmt: skip
            lines.append(
                f"| {level['multiple']:g}x ({level['rate']:.2f}/s) | {kind} | {r['sent']} "
                f"| {r['goodput']:.2f} | {r['answered']} | {_s(r['ttft_p50'])} "
                f"| {_s(r['ttft_p99'])} | {r['refused']} | {refusal} | {r['lost']} |"
            )
    lines += ["", "Ratios sluicegate / vLLM:", ""]
    for level in levels:
        ours, theirs = level["sluicegate"], level["vllm"]
        parts = [f"goodput {_ratio(ours['goodput'], theirs['goodput'])}"]
        parts.append(f"P99 TTFT of admitted {_ratio(ours['ttft_p99'], theirs['ttft_p99'])}")
        lines.append(f"- {level['multiple']:g}x: " + ", ".join(parts))
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or not theirs:
        return "–"
    return f"{ours / theirs:.2f}x"


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--objective", type=float, default=2.0, help="TTFT objective, s")
        parser.add_argument("--multiples", type=float, nargs="+", default=[1.0, 2.0, 4.0])
        parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
        parser.add_argument("--max-wait", type=float, default=120.0)
        parser.add_argument("--prompt-words", type=int, default=60)
        parser.add_argument("--capacity", type=float, help="req/s (default: measured)")

    args = parse_args(__doc__.splitlines()[0], [32], 2, 64, 1, 8796, extra)
    os.environ["SLUICEGATE_TTFT_OBJECTIVE"] = str(args.objective)  # vLLM's server ignores it
    capacity = args.capacity
    if capacity is None:
        process = start("vllm", args.model, args.port, args, RESULTS / "goodput-vllm.log")
        try:
            drive(args.port, args.model, 4, args, num_prompts=8, seed=0)
            capacity = drive(args.port, args.model, 32, args, num_prompts=64, seed=1)[
                "request_throughput"
            ]
        finally:
            stop(process)
    print(f"capacity: {capacity:.2f} req/s", flush=True)
    levels: list[dict[str, Any]] = []
    for index, multiple in enumerate(args.multiples):
        rate = capacity * multiple
        level: dict[str, Any] = {"multiple": multiple, "rate": rate}
        order = ("vllm", "sluicegate") if index % 2 == 0 else ("sluicegate", "vllm")
        for kind in order:
            print(f"--- {multiple:g}x capacity ({rate:.2f}/s): {kind}", flush=True)
            process = start(kind, args.model, args.port, args, RESULTS / f"goodput-{kind}.log")
            try:
                warm, _ = asyncio.run(open_loop(args.port, _warmup(args), 1.0, seed=7))
                if not all(o.status == 200 for o in warm):
                    raise SystemExit(f"{kind}: the warm-up failed")
                outcomes, window = asyncio.run(open_loop(args.port, args, rate, seed=100 + index))
            finally:
                stop(process)
            level[kind] = summary(outcomes, window, args.objective)
        levels.append(level)
    heading = (
        f"Machine: {machine()}; capacity {capacity:.2f} req/s (vLLM's server at concurrency "
        f"32); Poisson arrivals for {args.duration:g} s per level; ~{args.prompt_words} words "
        f"in, {args.output_len} tokens out, temperature 0.8; TTFT objective "
        f"{args.objective:g} s; {time.strftime('%Y-%m-%d')}"
    )
    publish(
        "goodput", heading, {"capacity": capacity, "levels": levels}, table(levels, args.objective)
    )


def _warmup(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "duration": 10.0})


if __name__ == "__main__":
    main()
