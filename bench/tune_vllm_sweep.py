"""The search `sluicegate tune` makes, done by hand with vLLM's own tool, `vllm bench sweep
serve`, for issue 46's comparison: how long it takes, and which setting it would pick.

The same profile (the one `bench/tune.py` made), the same engine steps (`SearchSpace`: one
knob at a time from today's settings; the gateway's admission bounds have no counterpart in
vLLM's server), the same traffic: the search part's window of the tune's second rung,
exported as vLLM's `timed_trace` and replayed at its own arrival times by `vllm bench serve`
(`bench/vllm_bench_serve.py`) against vLLM's own server, restarted for every setting, once
each, after a warm-up. vLLM's benchmark scores goodput itself (`--goodput`): a request counts
when its TTFT and its mean time per output token are within the targets (the tune judges a
request's own 90th percentile gap instead; the sweep has no P90 per request). The sweep picks
nothing (its SLA search was removed, vllm PR #35306): this script reads its results and takes
the setting with the most goodput, as an operator would.

    .venv/bin/python bench/tune_vllm_sweep.py          # `make bench-tune-sweep`: the newest
                                                       # profile bench/tune.py made
    .venv/bin/python bench/tune_vllm_sweep.py --profile bench/results/tune-chat-STAMP.jsonl \\
        --slo ttft_p90=2s,itl_p90=250ms --max-model-len 1024

Its results are in `bench/results/sweep-STAMP/`; the table is printed, with the sweep's time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main() -> int:
    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings
    from sluicegate.tuning.objective import Objective
    from sluicegate.tuning.profile import Profile, read_profile, split_in_time
    from sluicegate.tuning.search import Config
    from sluicegate.tuning.space import SearchSpace
    from sluicegate.tuning.trace_export import write_timed_trace
    from sluicegate.tuning.trials import WINDOWS, busiest
    from sluicegate.tuning.tune import today_values

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="default: the newest bench/tune.py made")
    parser.add_argument("--slo", default="ttft_p90=2s,itl_p90=250ms")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--rung", type=int, default=1, help="the tune's window to replay")
    args = parser.parse_args()
    if args.profile is None:
        made = sorted(RESULTS.glob("tune-*-*.jsonl"), key=lambda p: p.stat().st_mtime)
        if not made:
            raise SystemExit("no profile: run `make bench-tune` first, or give --profile")
        args.profile = made[-1]
    objective = Objective.parse(args.slo)
    settings = Settings(max_model_len=args.max_model_len)
    model = str(bundled_model_dir(settings.model_cache_dir))
    profile = read_profile(args.profile)
    search_part, _ = split_in_time(profile)
    window = busiest(search_part.requests, *WINDOWS[args.rung])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"sweep-{stamp}"
    out.mkdir(parents=True)
    trace = out / "trace.jsonl"
    write_timed_trace(Profile(tuple(window), profile.block_size), trace)

    space = SearchSpace.for_host(profile, today_values(settings), objective.ttft)
    configs = [Config(), *space.engine]
    params = [{"_benchmark_name": "today", "max_num_seqs": 256}]
    for config in space.engine:
        named = {k: v for k, v in config.knobs}
        params.append({"_benchmark_name": config.label().replace(" ", "_"), **named})
    (out / "serve_params.json").write_text(json.dumps(params, indent=1))

    port = free_port()
    serve = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", settings.model_name,
        "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--enable-prefix-caching", "--scheduling-policy", "fcfs",
    ]  # fmt: skip
    bench = [
        sys.executable, str(ROOT / "bench" / "vllm_bench_serve.py"),
        "--base-url", f"http://127.0.0.1:{port}", "--model", settings.model_name,
        "--tokenizer", model, "--backend", "openai", "--endpoint", "/v1/completions",
        "--dataset-name", "timed_trace", "--dataset-path", str(trace),
        "--timed-trace-chunk-hash-size", str(profile.block_size),
        "--num-prompts", str(len(window)), "--ignore-eos", "--disable-tqdm",
        "--metric-percentiles", "50,90,99",
        "--goodput", f"ttft:{objective.ttft * 1000:g}", f"tpot:{objective.itl * 1000:g}",
    ]  # fmt: skip
    # What the sweep does after each run for a server started as `vllm serve`: the prefix
    # cache emptied (it knows no server started as a module, so it is said here).
    reset = [
        sys.executable, "-c",
        f"import httpx; httpx.post('http://127.0.0.1:{port}/reset_prefix_cache').raise_for_status()",
    ]  # fmt: skip
    sweep = [
        sys.executable, "-m", "vllm.benchmarks.sweep.serve",
        "--serve-cmd", shlex.join(serve), "--bench-cmd", shlex.join(bench),
        "--after-bench-cmd", shlex.join(reset),
        "--serve-params", str(out / "serve_params.json"), "-o", str(out), "-e", "sweep",
        "--num-runs", "1", "--warmup-num-prompts", "8", "--server-ready-timeout", "600",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kvcache_space_gib)}  # fmt: skip
    began = time.monotonic()
    with (out / "sweep.log").open("wb") as log:
        done = subprocess.run(sweep, stdout=log, stderr=subprocess.STDOUT, env=env)
    minutes = (time.monotonic() - began) / 60

    rows = [_result(out / "sweep", p["_benchmark_name"]) for p in params]
    print(f"vllm bench sweep serve: exit {done.returncode} after {minutes:.1f} min, "
          f"{len(configs)} settings, {len(window)} requests each ({out})")  # fmt: skip
    print("\n| setting | goodput req/s | completed | P90 TTFT ms | mean TPOT ms | P90 ITL ms |")
    print("|---|---|---|---|---|---|")
    for param, row in zip(params, rows, strict=True):
        if row is None:
            print(f"| {param['_benchmark_name']} | (no result) | | | | |")
            continue
        print(
            f"| {param['_benchmark_name']} | {row.get('request_goodput', 0):.2f} | "
            f"{row.get('completed')} | {row.get('p90_ttft_ms', 0):.0f} | "
            f"{row.get('mean_tpot_ms', 0):.0f} | {row.get('p90_itl_ms', 0):.0f} |"
        )
    scored = [(r.get("request_goodput", 0.0), p["_benchmark_name"]) for p, r in
              zip(params, rows, strict=True) if r is not None]  # fmt: skip
    if scored:
        print(f"\nthe sweep's best by goodput: {max(scored)[1]}")
    return done.returncode


def _result(folder: Path, name: str) -> dict[str, Any] | None:
    """The run's result for the setting `name`, as the sweep saved it."""
    path = folder / f"SERVE--{name}" / "run=0.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


if __name__ == "__main__":
    raise SystemExit(main())
