"""What metrics and tracing cost: output-token throughput with all telemetry on against off.

Two variants of the same gateway, same model and engine flags as `compare_vllm.py`, driven
by the same load (`vllm.benchmarks.serve`, random prompts, 128 tokens in, 64 out,
`--ignore-eos`), in alternating order over the rounds:

- **on**: as shipped, plus tracing: every request traced (the default sampler) and exported
  over OTLP/HTTP (protobuf, batch processor) to a sink process on this machine that reads
  and drops the spans. The access log is written at INFO. The engine keeps its stats
  (`vllm:*` series).
- **off**: the gateway's telemetry removed: no request middleware, no engine-run hook, no
  tracing, and the engine started with `disable_log_stats=True` (no `vllm:*` series).

With `--capture`, a third variant, **capture**: "on" recording the traffic profile of every
request (`SLUICEGATE_TRAFFIC_CAPTURE`, sample 1) to a file in `bench/results/`, removed once
its lines are counted; its row is compared with "on".

The sink shares the machine's two cores with the gateway and the load generator, so its CPU
counts against "on".

    .venv/bin/python bench/telemetry_overhead.py                   # 2 rounds, concurrency 16
    .venv/bin/python bench/telemetry_overhead.py --rounds 4 --concurrency 1 16
    .venv/bin/python bench/telemetry_overhead.py --capture         # what the capture adds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from compare_vllm import (
    HEADERS,
    RESULTS,
    WARMUP_SEED,
    cells,
    drive,
    machine,
    parse_args,
    publish,
    ratio_row,
    stop,
    summarize,
    wait_ready,
)

VARIANTS = ("on", "off")


# ---- the variant server (run in a child process) ------------------------------------------


def serve_variant(variant: str, argv: list[str]) -> None:
    """`sluicegate serve` with the gateway's telemetry removed for `off`."""
    if variant == "off":
        from vllm.v1.engine.async_llm import AsyncLLM

        import sluicegate.app
        import sluicegate.inference.service

        class Passthrough:
            def __init__(self, app: Any, **_: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                await self.app(scope, receive, send)

        class NoTelemetry:
            def __init__(self, *_: Any) -> None:
                pass

            def __enter__(self) -> NoTelemetry:
                return self

            def __exit__(self, *_: Any) -> None:
                return None

            def step(self, *_: Any) -> None:
                pass

        start = AsyncLLM.from_vllm_config

        def without_stats(*args: Any, **kwargs: Any) -> Any:
            return start(*args, **{**kwargs, "disable_log_stats": True})

        sluicegate.app.TelemetryMiddleware = Passthrough  # type: ignore[assignment,misc]
        sluicegate.inference.service.GenerationTelemetry = NoTelemetry  # type: ignore[assignment,misc]
        AsyncLLM.from_vllm_config = without_stats  # type: ignore[method-assign]
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        os.environ["OTEL_TRACES_EXPORTER"] = "none"

    from sluicegate.cli import main

    raise SystemExit(main(["serve", *argv]))


# ---- the OTLP sink (run in a child process) ------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    requests = 0
    received = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests += 1
        type(self).received += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        stats = json.dumps({"requests": self.requests, "bytes": self.received}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(stats)))
        self.end_headers()
        self.wfile.write(stats)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def run_sink(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _Sink).serve_forever()


# ---- the benchmark -------------------------------------------------------------------------


def spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "SLUICEGATE_CPU_KVCACHE_SPACE_GIB": str(args.kv_cache_gib),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    sink = None
    capture = RESULTS / f"telemetry-capture-{os.getpid()}.jsonl"
    if variant == "capture":
        capture.unlink(missing_ok=True)
        env["SLUICEGATE_TRAFFIC_CAPTURE"] = str(capture)
    if variant in ("on", "capture"):
        sink_log = RESULTS / "telemetry-sink.log"
        sink = spawn([sys.executable, __file__, "--sink", str(args.sink_port)], sink_log, env)
        wait_ready(f"http://127.0.0.1:{args.sink_port}/", sink, f"sink (see {sink_log})", 30)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{args.sink_port}"
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    serve_args = [
        "--model", args.model, "--served-model-name", args.name, "--port", str(args.port),
        "--max-model-len", str(args.max_model_len), "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--enable-prefix-caching",
    ]  # fmt: skip
    log = RESULTS / f"telemetry-{variant}-server.log"
    server = spawn([sys.executable, __file__, "--serve", variant, "--", *serve_args], log, env)
    try:
        wait_ready(
            f"http://127.0.0.1:{args.port}/ready", server, f"{variant} server (see {log})", 600
        )
        metrics = httpx.get(f"http://127.0.0.1:{args.port}/metrics", timeout=10).text
        series = {
            "sluicegate": "sluicegate_requests_total{" in metrics,
            "vllm": "vllm:num_requests_running{" in metrics,
        }
        if args.warmup:
            drive(args.port, args.model, 4, args, num_prompts=8, seed=WARMUP_SEED)
        levels = {c: drive(args.port, args.model, c, args) for c in args.concurrency}
        exported = None
        if sink is not None:
            time.sleep(6)  # the batch processor exports every 5 s
            exported = httpx.get(f"http://127.0.0.1:{args.sink_port}/", timeout=5).json()
    finally:
        stop(server)
        if sink is not None:
            stop(sink)
    captured = None
    if variant == "capture":  # complete: the gateway has stopped
        captured = len(capture.read_bytes().splitlines()) - 1  # less its header
        capture.unlink()
    return {"levels": levels, "series": series, "exported": exported, "captured": captured}


def table(results: dict[str, list[dict[str, Any]]], levels: list[int]) -> str:
    variants = list(results)
    lines = [
        "| concurrency | telemetry | " + " | ".join(HEADERS) + " |",
        "|---|---|" + "---|" * len(HEADERS),
    ]
    for level in levels:
        figures = {
            variant: summarize([r["levels"][level] for r in runs])
            for variant, runs in results.items()
        }
        for variant in variants:
            lines.append(f"| {level} | {variant} | {cells(figures[variant])} |")
        lines.append(ratio_row(level, "on / off", figures["on"], figures["off"]))
        if "capture" in figures:
            lines.append(ratio_row(level, "capture / on", figures["capture"], figures["on"]))
    return "\n".join(lines)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sink-port", type=int, default=8792)
    parser.add_argument(
        "--capture", action="store_true", help="a third variant: on, capturing the traffic"
    )


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0], [16], 4, 16, 2, 8791,
        extra=_options,
    )  # fmt: skip
    variants = (*VARIANTS, "capture") if args.capture else VARIANTS
    started = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for variant in order:
            print(f"--- round {round_index + 1}: telemetry {variant}", flush=True)
            outcome = run_variant(variant, args)
            print(
                f"    series {outcome['series']}, exported {outcome['exported']}, "
                f"captured {outcome['captured']}",
                flush=True,
            )
            results[variant].append(outcome)

    elapsed = time.monotonic() - started
    heading = f"Machine: {machine()}; rounds: {args.rounds}; took {elapsed / 60:.1f} min"
    publish("telemetry", heading, results, table(results, args.concurrency))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_variant(sys.argv[2], sys.argv[4:])
    elif sys.argv[1:2] == ["--sink"]:
        run_sink(int(sys.argv[2]))
    else:
        main()
