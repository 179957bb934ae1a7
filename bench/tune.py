"""`sluicegate tune` on the bundled model, as issue 46's benchmark: a generated bursty profile
(the `chat` preset: conversations over shared system prompts, mixed lengths), tuned within a
budget, its confirmation's ratio and bound, and the whole run in `bench/results/`.

    .venv/bin/python bench/tune.py                       # `make bench-tune`
    .venv/bin/python bench/tune.py --rate 1.4 --slo ttft_p90=2s,itl_p90=250ms --budget 30m

The run's folder (`recommended.env`, `trials.csv`, `report.md`, `pareto.html`,
`pareto.png`, the trial gateways' logs) is `bench/results/tune-STAMP/`; the profile beside it.
Its time, from start to verdict, is printed with the verdict. The results are written up by
hand in `docs/benchmarks/` (with the plot copied there).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SLUICEGATE = [sys.executable, "-m", "sluicegate"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="chat")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=1.4, help="mean requests a second")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slo", default="ttft_p90=2s,itl_p90=250ms")
    parser.add_argument("--budget", default="30m")
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    profile = RESULTS / f"tune-{args.preset}-{stamp}.jsonl"
    out = RESULTS / f"tune-{stamp}"
    made = [
        *SLUICEGATE, "profile", "make", args.preset, "-o", str(profile),
        "--requests", str(args.requests), "--rate", str(args.rate),
        "--max-model-len", str(args.max_model_len), "--seed", str(args.seed),
    ]  # fmt: skip
    subprocess.run(made, check=True)
    began = time.monotonic()
    tuned = subprocess.Popen(
        [*SLUICEGATE, "tune", str(profile), "--slo", args.slo, "--budget", args.budget,
         "--out", str(out)],
    )  # fmt: skip
    # Stopped (Ctrl+C, SIGINT, SIGTERM), the tune is told as a user would tell it, and waited
    # for: it stops its gateways (subprocess.run would kill it outright). SIGINT gets a
    # handler of its own: started in the background by a shell, this process inherits it
    # ignored, and Python then raises no KeyboardInterrupt.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: tuned.send_signal(signal.SIGINT))
    code = tuned.wait()
    minutes = (time.monotonic() - began) / 60
    print(f"\nsluicegate tune: exit {code} after {minutes:.1f} min; see {out}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
