"""sluicegate against vLLM's own OpenAI server, same model, same engine flags, one run.

Both servers are started once, each on its own loopback port, and take turns: the one not
being measured is frozen (SIGSTOP to its process group), so its idle engine takes no core.
Each turn is one concurrency level of vLLM's benchmark module (`vllm.benchmarks.serve`) with
random prompts (128 tokens in, 64 out, `--ignore-eos`). Both servers run each level of a
round back to back, in alternating order (vLLM then sluicegate, then sluicegate then vLLM
for the next level, and so on), so the two runs of a pair are minutes apart at most and the
machine's drift falls on both sides alike. The table reports both servers and the ratio
sluicegate / vLLM.

    .venv/bin/python bench/compare_vllm.py                  # 1, 16 and 64 concurrent
    .venv/bin/python bench/compare_vllm.py --rounds 4       # pooled over four rounds
    .venv/bin/python bench/compare_vllm.py --lora           # to a LoRA adapter, on both
    .venv/bin/python bench/compare_vllm.py --api messages   # Anthropic's /v1/messages, on both
    .venv/bin/python bench/compare_vllm.py --reasoning      # a reasoning model, split on both
    .venv/bin/python bench/compare_vllm.py --images         # a vision model, an image each

With `--lora`, a rank-8 adapter made here with peft (`tests/support/adapters.py`) is loaded
by both servers at start-up (vLLM's `--lora-modules`, sluicegate's `LORA_MODULES`), and every
request names it. With `--api messages`, the same prompts go to both servers' `/v1/messages`,
streamed and greedy (`bench/messages_backend.py`): Anthropic's API has no `ignore_eos`, so
answers end where the model stops, at the same token on both. With `--reasoning`, both serve
the reasoning variant of the bundled model (`tests/support/reasoning_model.py`) with vLLM's
`step3` parser and the variant's template (vLLM's `--reasoning-parser`, sluicegate's
`REASONING_PARSER`): each answer's first sentence is thoughts, split from the rest on both
servers (vLLM's benchmark takes a first chunk of thoughts as the first token). With
`--images`, both serve the vision model the tests make (`tests/support/vision_model.py`), and
every request holds one random image inline (vLLM's `random-mm` set, a `data:` URI): the
gateway reads it, counts its tokens with vLLM's processor and hands vLLM the pixels; vLLM's
server decodes it itself.

Absolute numbers drift between machines and runs; the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy
import psutil

import messages_backend

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HEADERS = (
    "req/s", "out tok/s", "median TTFT ms", "mean TTFT ms", "P99 TTFT ms", "median TPOT ms",
)  # fmt: skip
KINDS = ("vllm", "sluicegate")
PARSER_NOTE = "step3 parser on both"
# The warm-up's prompts; each level of each round draws its own (`level_seed`, always >= 1).
WARMUP_SEED = 0
# First tokens closer than this came out of one engine step (a prefill step of one 128-token
# prompt takes hundreds of ms on a CPU; the tokens of one step reach the client within ms).
FIRST_TOKEN_GAP_S = 0.15


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The same engine configuration for both servers, spelled as vLLM's flags."""
    return [
        "--dtype", "float32", "--enforce-eager",
        "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--enable-prefix-caching",
    ]  # fmt: skip


def server_command(kind: str, model: str, port: int, args: argparse.Namespace) -> list[str]:
    lora = f"{ADAPTER}={args.adapter_path}" if args.adapter_path else None
    servers = args.api_servers
    # The same flags on both: sluicegate takes every setting as a flag of vLLM's spelling.
    reasoning = (
        ["--reasoning-parser", args.reasoning_parser, "--chat-template", args.chat_template]
        if args.reasoning_parser
        else []
    )
    if args.images:
        # One image a prompt on both (vLLM's `--limit-mm-per-prompt`, sluicegate's bound).
        reasoning = ["--chat-template", args.chat_template]
        reasoning += (
            ["--limit-mm-per-prompt", '{"image": 1}']
            if kind == "vllm"
            else ["--media-max-images", "1"]
        )
    if kind == "vllm":
        adapter = ["--enable-lora", "--max-lora-rank", "8", "--lora-modules", lora] if lora else []
        several = ["--api-server-count", str(servers)] if servers > 1 else []
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", args.name,
            "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
            *engine_flags(args), *adapter, *several, *reasoning,
        ]  # fmt: skip
    adapter = ["--max-lora-rank", "8", "--lora-modules", lora] if lora else []
    # Several workers need Redis (the Responses store); nothing here is cached.
    several = ["--workers", str(servers), "--redis-url", args.redis_url] if servers > 1 else []
    return [
        sys.executable, "-m", "sluicegate", "serve",
        "--model", model, "--served-model-name", args.name,
        "--port", str(port), "--max-model-len", str(args.max_model_len),
        "--dtype", "float32", "--enforce-eager",
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--enable-prefix-caching", *adapter, *several, *reasoning,
    ]  # fmt: skip


def start(
    kind: str, model: str, port: int, args: argparse.Namespace, log: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
    }
    wait_port_free(port)
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(kind, model, port, args), stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
    # sluicegate's /health is liveness; /ready says the engine is up (vLLM's /health does).
    ready = "/ready" if kind == "sluicegate" else "/health"
    wait_ready(f"http://127.0.0.1:{port}{ready}", process, f"{kind} server (see {log})", 600)
    return process


def wait_port_free(port: int, timeout_s: float = 60.0) -> None:
    """Until nothing accepts connections on `port`: a server stopped a moment ago may still
    answer there while it shuts down (vLLM's API server process outlives its parent), and the
    next server's readiness check would then be answered by the old one."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"port {port} still in use {timeout_s:.0f} s after its server stopped")
        time.sleep(0.5)


def wait_ready(url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    """Until `url` answers 200. If the process exits first, or `timeout_s` passes (the process
    is then stopped), the benchmark ends with `what` in its message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited early")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(process)
    raise SystemExit(f"{what} not ready in {timeout_s:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        os.killpg(process.pid, signal.SIGCONT)  # a frozen server only sees SIGTERM once thawed
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def freeze(process: subprocess.Popen[bytes]) -> None:
    """Stop every process of the server (API, engine core, workers) where it is."""
    os.killpg(process.pid, signal.SIGSTOP)


def thaw(process: subprocess.Popen[bytes], port: int) -> None:
    """Resume a frozen server and wait until it answers `/health` again."""
    os.killpg(process.pid, signal.SIGCONT)
    wait_ready(f"http://127.0.0.1:{port}/health", process, f"server on port {port}, thawed,", 60)


def level_seed(round_index: int, concurrency: int) -> int:
    """Prompts of one level in one round: both servers get the same ones, and no level of any
    round starts with prompts an earlier one left in the prefix cache (the servers live
    through all rounds). The first round keeps seed = concurrency, as before."""
    return 1000 * round_index + concurrency


def drive(
    port: int,
    model: str,
    concurrency: int,
    args: argparse.Namespace,
    num_prompts: int = 0,
    seed: int | None = None,
) -> dict[str, Any]:
    """One level of vLLM's own benchmark, in this process.

    Each level draws its own prompts (seed = concurrency unless given), so no level starts
    with prompts an earlier level or the warm-up left in the prefix cache: with one seed for
    all, the random dataset repeats its first prompts, and the first wave at 64 would be
    nearly free.
    """
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    messages_backend.register()
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    num_prompts = num_prompts or max(args.min_prompts, concurrency * args.prompts_per_slot)
    if args.api == "messages":
        api = ["--backend", messages_backend.BACKEND, "--endpoint", "/v1/messages"]
    else:
        api = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--ignore-eos"]
    dataset = ["--dataset-name", "random"]
    if args.images:
        # vLLM's random multimodal set: one random image a request, inline (a data: URI).
        side = str(args.image_side)
        dataset = [
            "--dataset-name", "random-mm", "--random-mm-base-items-per-request", "1",
            "--random-mm-num-mm-items-range-ratio", "0",
            "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
            "--random-mm-bucket-config", f"{{({side}, {side}, 1): 1.0}}",
        ]  # fmt: skip
    bench_args = parser.parse_args([
        *api,
        "--base-url", f"http://127.0.0.1:{port}", "--model", requested_model(args),
        "--tokenizer", model,
        *dataset, "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--seed", str(concurrency if seed is None else seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-detailed",
        *([] if args.temperature is None else ["--temperature", str(args.temperature)]),
    ])  # fmt: skip
    result: dict[str, Any] = bench_main(bench_args)
    if result.get("failed"):
        raise SystemExit(f"{result['failed']} requests failed at concurrency {concurrency}")
    # Keep the per-request timings (pooled over rounds by `summarize`), not the texts.
    for field in ("generated_texts", "itls", "errors", "input_lens"):
        result.pop(field, None)
    return result


T = TypeVar("T")
ADAPTER = "bench-lora"
"""The adapter's name on both servers, with `--lora`."""


def requested_model(args: argparse.Namespace) -> str:
    """What the requests name: the adapter with `--lora`, else the model."""
    return ADAPTER if args.adapter_path else str(args.name)


def probed_run(
    kind: str, repeat: int, args: argparse.Namespace, log: Path, probe: Callable[[int], T]
) -> tuple[dict[str, Any], T, T]:
    """One run of a paired benchmark: `kind`'s server started and warmed up, `args.requests`
    requests at concurrency `args.level`, and `probe(server pid)` just before and just after
    them; the server is stopped at the end."""
    process = start(kind, args.model, args.port, args, log)
    try:
        drive(args.port, args.model, 4, args, num_prompts=8, seed=WARMUP_SEED)
        before = probe(process.pid)
        result = drive(
            args.port, args.model, args.level, args, num_prompts=args.requests, seed=1000 + repeat
        )
        after = probe(process.pid)
    finally:
        stop(process)
    return result, before, after


def paired_runs(
    args: argparse.Namespace, measure: Callable[[str, int, argparse.Namespace], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`args.repeats` repeats of `measure` on both servers at `args.level`, A-B-B-A."""
    runs: list[dict[str, Any]] = []
    for repeat, _, order in turns(args.repeats, [args.level]):
        for kind in order:
            print(f"--- repeat {repeat + 1}: {kind}", flush=True)
            runs.append({"kind": kind, "repeat": repeat, **measure(kind, repeat, args)})
    return runs


def summarize(levels: list[dict[str, Any]]) -> list[float]:
    """One server's figures for one concurrency over all rounds, in `HEADERS` order.

    Throughputs are the median over rounds. Latencies pool every request of every round, so
    the median TTFT is the median request's, not the middle round's: at high concurrency a
    round's median swings by seconds with how a wave of arrivals splits over engine steps.
    TPOT is vLLM's: (latency - TTFT) / (output tokens - 1), per request.
    """
    ttfts = [t * 1000 for level in levels for t in level["ttfts"]]
    tpots = [
        (latency - ttft) * 1000 / (tokens - 1)
        for level in levels
        for ttft, latency, tokens in zip(
            level["ttfts"], level["latencies"], level["output_lens"], strict=True
        )
        if tokens > 1
    ]
    return [
        statistics.median(level["request_throughput"] for level in levels),
        statistics.median(level["output_throughput"] for level in levels),
        statistics.median(ttfts),
        statistics.fmean(ttfts),
        float(numpy.percentile(ttfts, 99)),
        statistics.median(tpots),
    ]


def ratio_row(level: int, label: str, ours: list[float], theirs: list[float]) -> str:
    ratios = [s / v if v else float("nan") for s, v in zip(ours, theirs, strict=True)]
    return f"| {level} | **{label}** | " + " | ".join(f"**{r:.2f}x**" for r in ratios) + " |"


def cells(values: list[float]) -> str:
    return " | ".join(f"{v:.2f}" if v < 100 else f"{v:.0f}" for v in values)


def turns(rounds: int, levels: list[int]) -> list[tuple[int, int, tuple[str, str]]]:
    """`(round, level, order)` in running order. The order flips from one level to the next
    and from one round to the next, so over an even number of rounds each level has each
    server first equally often."""
    schedule = []
    for round_index in range(rounds):
        for level_index, level in enumerate(levels):
            flip = (round_index + level_index) % 2
            schedule.append((round_index, level, KINDS[::-1] if flip else KINDS))
    return schedule


def run_turns(model: str, args: argparse.Namespace) -> dict[str, list[dict[int, dict[str, Any]]]]:
    """Both servers through every round and level; per server, one `{level: result}` per round."""
    ports = {kind: args.port + i for i, kind in enumerate(KINDS)}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    results: dict[str, list[dict[int, dict[str, Any]]]] = {
        kind: [{} for _ in range(args.rounds)] for kind in KINDS
    }
    try:
        for kind in KINDS:
            processes[kind] = start(kind, model, ports[kind], args, RESULTS / f"{kind}-server.log")
            if args.warmup:
                drive(ports[kind], model, 4, args, num_prompts=8, seed=WARMUP_SEED)
            freeze(processes[kind])
        for round_index, level, order in turns(args.rounds, args.concurrency):
            for kind in order:
                print(f"--- round {round_index + 1}, concurrency {level}: {kind}", flush=True)
                thaw(processes[kind], ports[kind])
                try:
                    server = psutil.Process(processes[kind].pid)
                    before = cpu_seconds(server)
                    result = drive(
                        ports[kind], model, level, args, seed=level_seed(round_index, level)
                    )
                    after = cpu_seconds(server)
                    result["cpu_seconds"] = {
                        "front end": after[0] - before[0],
                        "engine": after[1] - before[1],
                    }
                    results[kind][round_index][level] = result
                finally:
                    freeze(processes[kind])
    finally:
        for process in processes.values():
            stop(process)
    return results


def cpu_seconds(process: psutil.Process) -> tuple[float, float]:
    """CPU seconds (user and system) used so far by `process`, and by its children together.
    For a server: its front end (the process that serves HTTP, runs the engine's client,
    detokenizes and splits: the one started here), and the engine core and its workers."""
    own = process.cpu_times()
    children = 0.0
    for child in process.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        children += times.user + times.system
    return own.user + own.system, children


def cpu_table(results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int]) -> str:
    """Per level and server, CPU milliseconds per output token, front end and engine, over
    all rounds: on a host whose cores the front end shares with the engine, every
    millisecond the front end spends on a token is one the engine does not have."""
    lines = [
        "| concurrency | server | front-end CPU ms per token | engine CPU ms per token |",
        "|---|---|---|---|",
    ]
    for level in levels:
        per_token = {}
        for kind, runs in results.items():
            tokens = sum(sum(r[level]["output_lens"]) for r in runs)
            used = [
                sum(r[level]["cpu_seconds"][part] for r in runs) for part in ("front end", "engine")
            ]
            per_token[kind] = [1000 * u / tokens for u in used]
            lines.append(
                f"| {level} | {kind} | {per_token[kind][0]:.2f} | {per_token[kind][1]:.2f} |"
            )
        ratios = [s / v for s, v in zip(per_token["sluicegate"], per_token["vllm"], strict=True)]
        lines.append(f"| {level} | **ratio** | **{ratios[0]:.2f}x** | **{ratios[1]:.2f}x** |")
    return "\n".join(lines)


def table(results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int]) -> str:
    lines = [
        "| concurrency | server | " + " | ".join(HEADERS) + " |",
        "|---|---|" + "---|" * len(HEADERS),
    ]
    for level in levels:
        figures = {kind: summarize([r[level] for r in runs]) for kind, runs in results.items()}
        lines.append(f"| {level} | vLLM server | {cells(figures['vllm'])} |")
        lines.append(f"| {level} | sluicegate | {cells(figures['sluicegate'])} |")
        lines.append(ratio_row(level, "ratio", figures["sluicegate"], figures["vllm"]))
    return "\n".join(lines)


def first_token_groups(level: dict[str, Any], gap_s: float = FIRST_TOKEN_GAP_S) -> list[int]:
    """How many requests got their first token together, group after group, in one level.

    A group is one engine step's worth: first tokens less than `gap_s` apart. With requests
    sent in waves, this shows how each wave split over the engine's steps (the TTFT median
    hangs on it)."""
    firsts = sorted(s + t for s, t in zip(level["start_times"], level["ttfts"], strict=True))
    sizes: list[int] = []
    previous = None
    for first in firsts:
        if previous is None or first - previous >= gap_s:
            sizes.append(0)
        sizes[-1] += 1
        previous = first
    return sizes


def splits(results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int]) -> str:
    """Per level above 1, each round's first-token groups, for each server."""
    lines = ["| concurrency | server | first-token groups, round by round |", "|---|---|---|"]
    for level in (c for c in levels if c > 1):
        for kind, runs in results.items():
            rounds = "; ".join("+".join(map(str, first_token_groups(r[level]))) for r in runs)
            lines.append(f"| {level} | {kind} | {rounds} |")
    return "\n".join(lines)


def round_ratios(results: dict[str, list[dict[int, dict[str, Any]]]], levels: list[int]) -> str:
    """Per level, each round's sluicegate / vLLM ratio of output tok/s and of median TTFT.

    Both servers ran a level of a round back to back on the same machine, so the spread of
    these ratios over the rounds is the noise the pooled ratio in the main table carries."""
    lines = [
        "| concurrency | out tok/s ratio, round by round | median TTFT ratio, round by round |",
        "|---|---|---|",
    ]
    pairs = list(zip(results["sluicegate"], results["vllm"], strict=True))
    for level in levels:
        throughput = [
            s[level]["output_throughput"] / v[level]["output_throughput"] for s, v in pairs
        ]
        ttft = [
            statistics.median(s[level]["ttfts"]) / statistics.median(v[level]["ttfts"])
            for s, v in pairs
        ]
        lines.append(f"| {level} | {_ratios(throughput)} | {_ratios(ttft)} |")
    return "\n".join(lines)


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}x" for v in values)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def publish(name: str, heading: str, results: Any, report: str) -> None:
    """Print the table under its heading; keep it and the raw results in `bench/results`."""
    print(f"\n{heading}\n")
    print(report)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"{name}-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    (RESULTS / f"{name}-{stamp}.md").write_text(report + "\n")


def parse_args(
    description: str,
    concurrency: list[int],
    prompts_per_slot: int,
    min_prompts: int,
    rounds: int,
    port: int,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The options every engine benchmark here shares; `model` defaults to the bundled one."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", help="model folder (default: the prepared bundled SmolLM2)")
    parser.add_argument("--name", default="SmolLM2-135M-Instruct")
    parser.add_argument("--concurrency", type=int, nargs="+", default=concurrency)
    parser.add_argument("--prompts-per-slot", type=int, default=prompts_per_slot)
    parser.add_argument("--min-prompts", type=int, default=min_prompts)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=int, default=4)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--rounds", type=int, default=rounds, help="repeat every level")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--temperature", type=float, help="sent with every request (default: none is sent)"
    )
    parser.add_argument(
        "--api",
        choices=("chat", "messages"),
        default="chat",
        help="OpenAI's chat completions, or Anthropic's Messages API (greedy, no ignore_eos)",
    )
    parser.add_argument(
        "--api-servers",
        type=int,
        default=1,
        help="front-end processes: vLLM's --api-server-count, sluicegate's --workers",
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/9",
        help="sluicegate's Redis, with --api-servers above 1",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="both servers load a LoRA adapter made here, and every request names it",
    )
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="both servers serve a reasoning variant of the bundled model made here, and split "
        "its thoughts with vLLM's step3 parser",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help="both servers serve the vision model the tests make (Idefics3 over the bundled "
        "SmolLM2), and every request holds one random image inline (vLLM's random-mm set)",
    )
    parser.add_argument(
        "--image-side", type=int, default=256, help="with --images: each image's side, pixels"
    )
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    args.adapter_path = None
    args.reasoning_parser = args.chat_template = None
    if args.reasoning:
        sys.path.insert(0, str(ROOT))
        from tests.support.reasoning_model import PARSER, TEMPLATE_FILE, reasoning_model

        args.model = str(reasoning_model())
        args.reasoning_parser = PARSER
        args.chat_template = str(Path(args.model) / TEMPLATE_FILE)
    if args.images:
        sys.path.insert(0, str(ROOT))
        from tests.support.vision_model import vision_model

        args.model = str(vision_model())
        args.chat_template = str(Path(args.model) / "chat_template.jinja")
    if args.lora:
        sys.path.insert(0, str(ROOT))
        from tests.support.adapters import make_adapters

        made = make_adapters(RESULTS / "adapters", {ADAPTER: 0})
        args.adapter_path = str(made[ADAPTER])
    if args.model is None:
        from sluicegate.engine.model import bundled_model_dir
        from sluicegate.settings import Settings

        args.model = str(bundled_model_dir(Settings().model_cache_dir))
    return args


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], [1, 16, 64], 2, 8, 1, 8790)

    results = run_turns(args.model, args)
    shape = f"{args.input_len} tokens in / {args.output_len} out"
    if args.lora:
        shape += f"; every request to the LoRA adapter {ADAPTER} (rank 8)"
    name = "compare-lora" if args.lora else "compare"
    if args.reasoning:
        shape += f"; a reasoning model (the bundled one taught `</think>`, vLLM's {PARSER_NOTE})"
        name += "-reasoning"
    if args.images:
        shape += (
            f"; one random {args.image_side}x{args.image_side} image a request, inline, on a "
            "vision model made from the bundled one (Idefics3, 64-pixel tiles)"
        )
        name += "-images"
    if args.api == "messages":
        shape = f"/v1/messages streamed, greedy; {args.input_len} tokens in, up to "
        shape += f"{args.output_len} out"
        name += "-messages"
    publish(
        name,
        f"Machine: {machine()}; rounds: {args.rounds}; {shape}",
        results,
        "\n\n".join(
            [
                table(results, args.concurrency),
                round_ratios(results, args.concurrency),
                splits(results, args.concurrency),
                cpu_table(results, args.concurrency),
            ]
        ),
    )


if __name__ == "__main__":
    main()
