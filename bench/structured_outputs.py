"""Structured outputs: sluicegate against vLLM's own OpenAI server, same model, same engine
flags (xgrammar with compact whitespace on both), one run, paired in time.

The load: chat completions constrained by one JSON schema of 5 fields
(`response_format: json_schema`), greedy, streamed with usage, `--requests` of them at
`--concurrency`, the same request set for both servers. sluicegate is asked to bypass its
response cache (`Cache-Control: no-cache`), so both servers generate every request.

Rounds run A-B-B-A: vLLM then sluicegate, then sluicegate then vLLM, and so on; the server
not being measured is frozen (SIGSTOP), as in `compare_vllm.py`, whose helpers start, freeze
and stop the servers.

Grammar compile time, two ways:
- end to end: the time to first token of a lone request whose schema neither server has seen
  (the engine compiles its grammar before the prefill) against the same request sent again
  (the grammar is in xgrammar's cache), a few times on each server;
- xgrammar alone: compiling the schema with the model's tokenizer, cold (a new compiler)
  and cached (`GrammarCompiler`'s cache), in this process.

    .venv/bin/python bench/structured_outputs.py --rounds 2 --requests 32
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
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import (
    KINDS,
    RESULTS,
    freeze,
    machine,
    parse_args,
    publish,
    server_command,
    stop,
    thaw,
    wait_ready,
)

COMPACT_XGRAMMAR = {"backend": "xgrammar", "disable_any_whitespace": True}
"""What sluicegate's engine runs with by default (SLUICEGATE_STRUCTURED_COMPACT_WHITESPACE)."""
COMPILE_PROBES = 3


def five_field_schema(tag: str = "") -> dict[str, Any]:
    """The benchmark's schema; a `tag` renames its fields, making a schema no cache holds."""
    suffix = f"_{tag}" if tag else ""
    return {
        "type": "object",
        "properties": {
            f"name{suffix}": {"type": "string", "maxLength": 24},
            f"age{suffix}": {"type": "integer", "minimum": 0, "maximum": 120},
            f"city{suffix}": {"type": "string", "enum": ["Paris", "Rome", "Oslo", "Lima"]},
            f"member{suffix}": {"type": "boolean"},
            f"score{suffix}": {"type": "number", "minimum": 0, "maximum": 100},
        },
        "required": [f"{f}{suffix}" for f in ("name", "age", "city", "member", "score")],
        "additionalProperties": False,
    }


def request_body(name: str, index: int, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {
        "model": name,
        "messages": [
            {"role": "user", "content": f"Invent member number {index} of a chess club, as JSON."}
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "member", "schema": schema, "strict": True},
        },
    }


@dataclass(frozen=True, slots=True)
class Reading:
    """One streamed response: time to first content, total time, output tokens, text."""

    ttft: float
    latency: float
    tokens: int
    text: str


def read_stream(lines: list[bytes], started: float, stamps: list[float]) -> Reading:
    """A Reading from a response's SSE lines and the clock reading when each arrived."""
    first: float | None = None
    tokens = 0
    parts: list[str] = []
    for line, stamp in zip(lines, stamps, strict=True):
        data = line.strip().removeprefix(b"data: ")
        if not data or data == b"[DONE]" or not line.startswith(b"data: "):
            continue
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"error event: {event['error']}")
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            if text and first is None:
                first = stamp
            parts.append(text)
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    end = stamps[-1] if stamps else started
    return Reading((first or end) - started, end - started, tokens, "".join(parts))


async def send(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Reading:
    started = time.perf_counter()
    lines: list[bytes] = []
    stamps: list[float] = []
    async with http.post(url, json=body, headers={"Cache-Control": "no-cache"}) as response:
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {await response.text()}")
        async for line in response.content:
            lines.append(line)
            stamps.append(time.perf_counter())
    return read_stream(lines, started, stamps)


async def load(port: int, args: argparse.Namespace, round_index: int) -> dict[str, Any]:
    """The round's request set at the concurrency; throughput over the whole batch."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    schema = five_field_schema()
    limit = asyncio.Semaphore(args.concurrency_level)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(index: int) -> Reading:
            body = request_body(args.name, 1000 * round_index + index, schema, args.max_tokens)
            async with limit:
                return await send(http, url, body)

        started = time.perf_counter()
        readings = await asyncio.gather(*(one(i) for i in range(args.requests)))
        elapsed = time.perf_counter() - started
    invalid = sum(1 for r in readings if not _valid(r.text, schema))
    return {
        "elapsed": elapsed,
        "req_per_s": len(readings) / elapsed,
        "tok_per_s": sum(r.tokens for r in readings) / elapsed,
        "ttfts": [r.ttft for r in readings],
        "latencies": [r.latency for r in readings],
        "tokens": [r.tokens for r in readings],
        "invalid": invalid,
    }


def _valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


async def compile_probe(port: int, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(TTFT with a schema never seen, TTFT with it again), one lone request each, a few times."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    pairs = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        for probe in range(COMPILE_PROBES):
            schema = five_field_schema(uuid.uuid4().hex[:8])
            body = request_body(args.name, 7 + probe, schema, 8)
            cold = await send(http, url, body)
            warm = await send(http, url, body)
            pairs.append((cold.ttft, warm.ttft))
    return pairs


def xgrammar_compile_times(model: str) -> dict[str, float]:
    """Compiling the 5-field schema with xgrammar alone: cold (a new compiler, empty cache),
    and cached; milliseconds, median of a few. Compact whitespace, as the engine does."""
    import xgrammar
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    options = {"any_whitespace": False, "separators": (",", ":")}
    cold, cached = [], []
    for attempt in range(COMPILE_PROBES):
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        schema = json.dumps(five_field_schema(f"x{attempt}"))
        started = time.perf_counter()
        compiler.compile_json_schema(schema, **options)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        compiler.compile_json_schema(schema, **options)
        cached.append(time.perf_counter() - started)
    return {
        "cold_ms": 1000 * statistics.median(cold),
        "cached_ms": 1000 * statistics.median(cached),
    }


def order(round_index: int) -> tuple[str, str]:
    """A-B-B-A: vLLM first in even rounds, sluicegate first in odd ones."""
    return KINDS if round_index % 2 == 0 else (KINDS[1], KINDS[0])


def start_server(kind: str, port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    command = server_command(kind, args.model, port, args)
    if kind == "vllm":
        command += ["--structured-outputs-config", json.dumps(COMPACT_XGRAMMAR)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
    }
    log = RESULTS / f"structured-{kind}-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    wait_ready(f"http://127.0.0.1:{port}/health", process, f"{kind} server (see {log})", 600)
    return process


def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = {kind: args.port + i for i, kind in enumerate(KINDS)}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    probes: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    try:
        for kind in KINDS:
            processes[kind] = start_server(kind, ports[kind], args)
            # Warm-up: a few requests with the benchmark's schema (its grammar compiled once).
            warm = argparse.Namespace(**{**vars(args), "requests": 4, "concurrency_level": 4})
            asyncio.run(load(ports[kind], warm, 99))
            freeze(processes[kind])
        for round_index in range(args.rounds):
            for kind in order(round_index):
                print(f"--- round {round_index + 1}: {kind}", flush=True)
                thaw(processes[kind], ports[kind])
                try:
                    rounds[kind].append(asyncio.run(load(ports[kind], args, round_index)))
                    probes[kind] += asyncio.run(compile_probe(ports[kind], args))
                finally:
                    freeze(processes[kind])
    finally:
        for process in processes.values():
            stop(process)
    return {"rounds": rounds, "probes": probes}


def summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    ttfts = [t for r in rounds for t in r["ttfts"]]
    return {
        "req/s": statistics.median(r["req_per_s"] for r in rounds),
        "out tok/s": statistics.median(r["tok_per_s"] for r in rounds),
        "median TTFT ms": 1000 * statistics.median(ttfts),
        "median latency ms": 1000 * statistics.median(t for r in rounds for t in r["latencies"]),
        "mean out tokens": statistics.fmean(t for r in rounds for t in r["tokens"]),
        "invalid JSON": float(sum(r["invalid"] for r in rounds)),
    }


def report(results: dict[str, Any], compile_ms: dict[str, float]) -> str:
    figures = {kind: summary(results["rounds"][kind]) for kind in KINDS}
    headers = list(figures["vllm"])
    lines = [
        "| server | " + " | ".join(headers) + " |",
        "|---|" + "---|" * len(headers),
    ]
    for kind, label in (("vllm", "vLLM server"), ("sluicegate", "sluicegate")):
        lines.append(f"| {label} | " + " | ".join(_cell(v) for v in figures[kind].values()) + " |")
    ratios = [
        figures["sluicegate"][h] / figures["vllm"][h] if figures["vllm"][h] else float("nan")
        for h in headers[:4]
    ]
    lines.append("| **ratio** | " + " | ".join(f"**{r:.2f}x**" for r in ratios) + " | | |")
    per_round = [
        s["tok_per_s"] / v["tok_per_s"]
        for s, v in zip(results["rounds"]["sluicegate"], results["rounds"]["vllm"], strict=True)
    ]
    lines += [
        "",
        "Output tok/s ratio, round by round: " + ", ".join(f"{r:.2f}x" for r in per_round),
    ]
    lines += [
        "",
        "| server | TTFT, new schema (ms) | TTFT, same schema again (ms) | difference (ms) |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        pairs = results["probes"][kind]
        cold = statistics.median(c for c, _ in pairs) * 1000
        warm = statistics.median(w for _, w in pairs) * 1000
        lines.append(f"| {kind} | {cold:.0f} | {warm:.0f} | {cold - warm:.0f} |")
    lines += [
        "",
        f"xgrammar alone, 5-field schema: cold compile {compile_ms['cold_ms']:.1f} ms, "
        f"cached {compile_ms['cached_ms']:.3f} ms (median of {COMPILE_PROBES}).",
    ]
    return "\n".join(lines)


def _cell(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def main() -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=int, default=32)
        parser.add_argument("--max-tokens", type=int, default=96)

    args = parse_args(__doc__.splitlines()[0], [16], 2, 8, 2, 8810, extra)
    args.concurrency_level = args.concurrency[0]
    compile_ms = xgrammar_compile_times(args.model)
    results = run(args)
    heading = (
        f"Machine: {machine()}; rounds: {args.rounds} (A-B-B-A); {args.requests} requests at "
        f"concurrency {args.concurrency_level}, 5-field JSON schema, greedy"
    )
    publish("structured", heading, {**results, "xgrammar": compile_ms}, report(results, compile_ms))


if __name__ == "__main__":
    main()
