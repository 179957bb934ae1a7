"""`sluicegate profile check | make | export`: traffic profiles for `sluicegate tune`.

Exit codes: 0 done; 2 a profile that cannot be tuned on (the line, from 1, and the field are
named) or a bad argument.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

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
    export = actions.add_parser("export", help="a profile as vLLM's timed trace")
    export.add_argument("path", type=Path)
    export.add_argument("--timed-trace", type=Path, required=True)


def run_profile(args: dict[str, object]) -> int:
    action = args["profile_command"]
    try:
        if action == "make":
            return _make(args)
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
