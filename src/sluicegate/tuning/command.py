"""`sluicegate profile check | make | export` (traffic profiles) and `sluicegate tune`.

Exit codes: 0 done; 2 a profile that cannot be tuned on (the line, from 1, and the field are
named) or a bad argument; `tune` also 3 (nothing met the objective) and 1 (a trial gateway
failed), as `tuning/tune.py` says.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from sluicegate.tuning.access_log import profile_from_access_log
from sluicegate.tuning.presets import PRESETS, make_preset
from sluicegate.tuning.profile import MIN_REQUESTS, ProfileError, read_profile
from sluicegate.tuning.trace_export import replay_command, write_timed_trace


def add_profile_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    profile = commands.add_parser("profile", help="traffic profiles for `sluicegate tune`")
    actions = profile.add_subparsers(dest="profile_command", required=True)
    check = actions.add_parser("check", help="check that a profile can be tuned on")
    check.add_argument("path", type=Path)
    check.add_argument(
        "--max-model-len", type=int, help="the model's window (default: the header's)"
    )
    make = actions.add_parser("make", help="write a synthetic profile")
    make.add_argument("preset", choices=PRESETS)
    make.add_argument("-o", "--output", type=Path, required=True)
    make.add_argument("--requests", type=int, default=400)
    make.add_argument("--rate", type=float, default=2.0, help="mean requests a second")
    make.add_argument("--max-model-len", type=int, default=2048)
    make.add_argument("--seed", type=int, default=0)
    from_log = actions.add_parser(
        "from-log", help="a profile from the gateway's JSON access log (no prefix sharing)"
    )
    from_log.add_argument("log", type=Path)
    from_log.add_argument("-o", "--output", type=Path, required=True)
    from_log.add_argument("--max-model-len", type=int, default=4096)
    export = actions.add_parser("export", help="a profile as vLLM's timed trace")
    export.add_argument("path", type=Path)
    export.add_argument("--timed-trace", type=Path, required=True)


def add_tune_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune", help="tune the engine and admission on a traffic profile (docs/tuning.md)"
    )
    tune.add_argument("profile", help="a profile (a capture, `profile make`) or a preset name")
    tune.add_argument(
        "--slo", required=True, help="the objective: ttft_p90=2s,itl_p90=300ms (s or ms)"
    )
    tune.add_argument("--budget", required=True, help="time the tune may take: 30m, 900s")
    tune.add_argument("--out", type=Path, help="the output folder (default ./tune-DATE-TIME)")
    tune.add_argument("--seed", type=int, default=0, help="a preset's seed")


def run_tune_command(args: dict[str, object]) -> int:
    import asyncio

    from sluicegate.tuning.tune import UsageError, plan, run_tune

    try:
        checked = plan(args)
    except UsageError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2

    async def tune_until_stopped() -> int:
        # SIGTERM, Ctrl+C and a closed terminal end the tune through its `finally`, which
        # stops every trial gateway; a second signal while it does is ignored, so that the
        # stopping finishes (a gateway left frozen would hold its memory for good).
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def stop() -> None:
            if not task.cancelling():
                print("sluicegate: stopping the tune and its trial gateways", file=sys.stderr)
                task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop)
        return await run_tune(checked)

    try:
        return asyncio.run(tune_until_stopped())
    except asyncio.CancelledError:
        print("sluicegate: tune stopped; its trial gateways are stopped", file=sys.stderr)
        return 130


def run_profile(args: dict[str, object]) -> int:
    action = args["profile_command"]
    try:
        if action == "make":
            return _make(args)
        if action == "from-log":
            return _from_log(args)
        path = args["path"]
        assert isinstance(path, Path)
        window = args.get("max_model_len")
        profile = read_profile(path, window if isinstance(window, int) else None)
    except ProfileError as exc:
        print(f"sluicegate: {args.get('path')}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    if action == "check":
        print(
            f"{len(profile.requests)} engine requests over {profile.span:.0f} s; prefixes "
            f"{'shared' if profile.shares_prefixes() else 'not shared'}; priorities "
            f"{'mixed' if profile.has_priorities() else 'one'}"
        )
        return 0
    out = args["timed_trace"]
    assert isinstance(out, Path)
    try:
        write_timed_trace(profile, out)
    except OSError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    print(replay_command(out, profile, "http://127.0.0.1:8000", "MODEL"))
    return 0


def _make(args: dict[str, object]) -> int:
    requests, rate, window, seed = (
        args["requests"], args["rate"], args["max_model_len"], args["seed"]
    )  # fmt: skip
    assert isinstance(requests, int) and isinstance(rate, float)
    assert isinstance(window, int) and isinstance(seed, int)
    if requests < MIN_REQUESTS or not 0 < rate < math.inf or window < 64:
        print(
            f"sluicegate: --requests >= {MIN_REQUESTS}, a finite --rate > 0, --max-model-len >= 64",
            file=sys.stderr,
        )
        return 2
    preset = args["preset"]
    assert isinstance(preset, str)
    profile = make_preset(preset, requests=requests, rate=rate, max_model_len=window, seed=seed)
    output = args["output"]
    assert isinstance(output, Path)
    try:
        profile.write(output)
    except OSError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    print(f"{output}: {len(profile.requests)} requests over {profile.span:.0f} s")
    return 0


def _from_log(args: dict[str, object]) -> int:
    log, output, window = args["log"], args["output"], args["max_model_len"]
    assert isinstance(log, Path) and isinstance(output, Path) and isinstance(window, int)
    with log.open(encoding="utf-8", errors="replace") as lines:
        profile = profile_from_access_log(lines, window)
    if len(profile.requests) < MIN_REQUESTS:
        print(
            f"sluicegate: {log}: {len(profile.requests)} engine requests in the access log, "
            f"fewer than the {MIN_REQUESTS} a tune needs (is LOG_FORMAT json?)",
            file=sys.stderr,
        )
        return 2
    profile.write(output)
    print(
        f"{output}: {len(profile.requests)} requests over {profile.span:.0f} s (no prefix blocks)"
    )
    return 0
