"""`sluicegate tune PROFILE --slo ttft_p90=2s,itl_p90=300ms --budget 30m [--out DIR]`.

In order: the arguments, today's settings and the profile are checked (exit 2, naming what
is wrong, before any engine starts); the profile is split in time (the last quarter held
out); today's gateway starts; the admission bounds are searched on it (no restart), then the
engine's knobs, each with the best bound; the best is confirmed against today's settings on
the held-out traffic in paired rounds; the outputs are written. Exit codes: 0 a
recommendation, or "keep the current settings" on the last line; 2 a bad profile or argument;
3 nothing met the objective (the outputs and the plot still written); 1 a trial gateway
failed (its log named). A budget too short for the first round of trials and the
confirmation is an exit 2 too, told as soon as today's engine has started (its start time is
what it could not know before).
"""

from __future__ import annotations

import asyncio
import glob
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from sluicegate.setting_names import dotenv_file
from sluicegate.settings import Settings, describe_error
from sluicegate.tuning.confirm import Confirmation, confirm
from sluicegate.tuning.gateways import GatewayFailed, GatewayProcess, dotenv_conflicts
from sluicegate.tuning.objective import Objective, parse_duration
from sluicegate.tuning.outputs import (
    Row,
    machine_info,
    write_recommended_env,
    write_report,
    write_trials_csv,
)
from sluicegate.tuning.presets import PRESETS, make_preset
from sluicegate.tuning.profile import Profile, ProfileError, read_profile, split_in_time
from sluicegate.tuning.reaper import reaper
from sluicegate.tuning.search import Budget, Config, Trial, search
from sluicegate.tuning.space import ADMISSION_KNOBS, ENGINE_KNOBS, SearchSpace, needs_restart
from sluicegate.tuning.trials import CONFIRM_WINDOW, WINDOWS, Gateway, GatewayTrials

KEEP = "keep the current settings"


class UsageError(Exception):
    """Exit 2: a bad argument, setting or profile; the message says which."""


@dataclass(frozen=True, slots=True)
class Plan:
    profile: Profile
    profile_name: str
    search_part: Profile
    held_out: Profile
    objective: Objective
    budget: float
    out: Path
    settings: Settings
    seed: int


def plan(args: dict[str, object]) -> Plan:
    """Everything checked before anything starts; `UsageError` names what is wrong."""
    try:
        objective = Objective.parse(str(args["slo"]))
        budget = parse_duration(str(args["budget"]))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        settings = Settings()
    except ValidationError as exc:
        raise UsageError(describe_error(exc)) from None
    if settings.upstreams:
        raise UsageError(
            "tune tunes the in-process engine: unset SLUICEGATE_UPSTREAM_URLS (and the models "
            "file's upstreams) for the tune"
        )
    if settings.models_file is not None:
        raise UsageError("tune tunes the one in-process engine: unset SLUICEGATE_MODELS_FILE")
    conflicts = dotenv_conflicts(dotenv_file())
    if conflicts:
        raise UsageError(
            f".env sets {', '.join(conflicts)}, which a trial gateway must not take (it reads "
            ".env too): run the tune where no .env sets them"
        )
    seed = args.get("seed")
    seed = seed if isinstance(seed, int) else 0
    name = str(args["profile"])
    try:
        if name in PRESETS and not Path(name).exists():
            profile = make_preset(name, max_model_len=settings.max_model_len, seed=seed)
        else:
            profile = read_profile(Path(name), settings.max_model_len)
    except ProfileError as exc:
        raise UsageError(f"{name}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"{name}: {exc.strerror or exc}") from None
    profile = _sampled(profile)
    try:
        search_part, held_out = split_in_time(profile)
    except ValueError as exc:
        raise UsageError(f"{name}: {exc}") from None
    for part, what, least in (
        (search_part, "its first three quarters (searched on)", WINDOWS[0][1]),
        (held_out, "its last quarter (held out to confirm on)", CONFIRM_WINDOW[1]),
    ):
        if len(part.requests) < least:
            raise UsageError(
                f"{name}: {what} holds {len(part.requests)} requests, fewer than the "
                f"{least} a run needs: capture longer, or more evenly over time"
            )
    out = args.get("out")
    folder = out if isinstance(out, Path) else Path(f"tune-{datetime.now():%Y%m%d-%H%M%S}")
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"{folder} is not empty: name another with --out")
    return Plan(profile, name, search_part, held_out, objective, budget, folder, settings, seed)


def _sampled(profile: Profile) -> Profile:
    """A capture that kept a share `sample` of the requests replays at the rate the gateway
    saw: its times are drawn together by that share."""
    sample = profile.header.get("sample", 1.0)
    if not isinstance(sample, (int, float)) or not 0 < sample < 1:
        return profile
    moved = tuple(replace(r, t=r.t * sample) for r in profile.requests)
    return Profile(moved, profile.block_size, dict(profile.header))


def today_values(settings: Settings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in (*ENGINE_KNOBS, *ADMISSION_KNOBS)}


def streams_missed(trials: Sequence[Trial]) -> bool:
    """Whether today's settings, on the first window, missed more requests by streams too slow
    than by first tokens too late (then the engine steps that bound a step's work go first)."""
    today = next((t for t in trials if t.config == Config() and t.window == 0), None)
    return today is not None and today.score.slow_streams > today.score.slow_starts


def gpu_count() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


def pairs_for(budget: float, pair_seconds: float) -> int:
    """Confirmation pairs fixed before the search, from the budget: about a third of it,
    3 at least, 8 at most."""
    return max(3, min(8, math.floor(budget / 3 / max(pair_seconds, 1.0))))


async def vocabulary(settings: Settings) -> list[int]:
    """The model's ordinary token ids (no special or added ones): what replayed prompts are
    drawn from."""
    from sluicegate.engine.model import resolve_model

    path = resolve_model(settings.model, settings.model_cache_dir)

    def load() -> list[int]:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, revision=settings.revision)
        special = set(tokenizer.all_special_ids)
        return [i for i in range(tokenizer.vocab_size) if i not in special]

    return await asyncio.to_thread(load)


class Progress:
    """A line on stderr per run: what ran, how it did, the time left."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.count = 0

    def __call__(self, row: Row) -> None:
        self.count += 1
        left = max(0.0, self.budget.left())
        what = "confirm" if row.stage == "confirm" else f"trial {self.count}"
        kind = "engine" if needs_restart(row.config) else "gateway"
        print(
            f"[{what}] {kind} {row.config.label()} | goodput {row.score.goodput:.2f}/s "
            f"attain {row.score.attainment:.0%}{' stopped early' if row.stopped_early else ''}"
            f" (P90 TTFT {row.score.ttft_p90:.2f} s, P90 ITL {row.score.itl_p90 * 1000:.0f} ms)"
            f" | {int(left // 60)}m{int(left % 60):02d}s left",
            file=sys.stderr,
            flush=True,
        )


Starter = Callable[[Config, Path], Gateway]
"""A gateway not yet started, with these engine knobs, logging to this file."""


async def run_tune(
    plan_: Plan, starter: Starter | None = None, words: Sequence[int] | None = None
) -> int:
    """The tune; `starter` and `words` stand in for `sluicegate serve` processes and the
    model's vocabulary (the tests give fakes)."""
    began = time.monotonic()
    plan_.out.mkdir(parents=True, exist_ok=True)
    print(f"sluicegate: tuning into {plan_.out}", file=sys.stderr, flush=True)
    budget = Budget(plan_.budget)
    pairs = 0
    today = today_values(plan_.settings)
    space = SearchSpace.for_host(plan_.profile, today, plan_.objective.ttft, gpu_count())
    gateways: list[Gateway] = []
    make = starter or GatewayProcess

    async def launch(engine: Config, name: str) -> Gateway:
        gateway = make(engine, plan_.out / "logs" / f"{name}.log")
        gateways.append(gateway)
        await gateway.start()
        return gateway

    trials: GatewayTrials | None = None
    searched: list[Trial] = []
    best: Config | None = None
    confirmation: Confirmation | None = None
    failed: str | None = None
    try:
        words = words if words is not None else await vocabulary(plan_.settings)
        baseline = await launch(Config(), "today")
        trials = GatewayTrials(
            launch=launch,
            today=baseline,
            today_bounds={k: today[k] for k in ADMISSION_KNOBS},
            search_part=plan_.search_part,
            held_out=plan_.held_out,
            objective=plan_.objective,
            vocabulary=words,
            scheduling_policy=plan_.settings.scheduling_policy,
            exclusive=gpu_count() > 0,
            on_row=Progress(budget),
        )
        await trials.warm(baseline)
        await trials.prime(baseline)  # what each run's start costs, for the plan below
        pairs = pairs_for(plan_.budget, trials.pair_cost())
        reserve = pairs * trials.pair_cost() + baseline.started_in
        least = reserve + sum(trials.cost(c, 0) for c in space.admission)
        if budget.left() < least:
            spent = plan_.budget - budget.left()
            print(
                f"sluicegate: the budget leaves no time to search: today's engine started in "
                f"{baseline.started_in:.0f} s, and the first trials and the confirmation need "
                f"{least:.0f} s more; give at least --budget {math.ceil((spent + least) / 60)}m",
                file=sys.stderr,
            )
            return 2
        first = await search(
            trials, space.admission, len(WINDOWS), budget,
            reserve=reserve + max(0.0, budget.left() - reserve) / 2,
        )  # fmt: skip
        searched += first.trials
        bounds = first.best if first.best is not None else Config()
        steps = space.engine_with(bounds, slow_streams=streams_missed(first.trials))
        second = await search(trials, steps, len(WINDOWS), budget, reserve=reserve)
        searched += second.trials
        best = second.best if second.best is not None else first.best
        if best is not None and best != Config():
            pair_cost = trials.pair_cost()
            confirmation = await confirm(
                trials, Config(), best, pairs, fits=lambda: budget.left() >= pair_cost
            )
        await trials.close()
    except GatewayFailed as exc:
        failed = f"today's gateway failed: {exc}"
        print(f"sluicegate: {failed}", file=sys.stderr)
    finally:
        await _stop_all(gateways)
        reaper.close()
    rows = trials.rows if trials is not None else []
    code = await asyncio.to_thread(
        _write_outputs, plan_, rows, searched, best, confirmation, pairs,
        (time.monotonic() - began) / 60, failed,
    )  # fmt: skip
    return 1 if failed else code


async def _stop_all(gateways: Sequence[Gateway]) -> None:
    """Every gateway the tune started, stopped, whatever stopped the tune: shielded from a
    second cancel (a second Ctrl+C), so that none is left running or frozen."""
    stopping = asyncio.ensure_future(asyncio.gather(*(g.stop() for g in gateways)))
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        await stopping
        raise


def verdict(
    best: Config | None, confirmation: Confirmation | None, failed: str | None = None
) -> tuple[Config | None, str]:
    """What to do, and the configuration recommended (None: keep today's)."""
    if failed is not None:
        return None, f"{failed}: " + KEEP
    if best is None:
        return None, "no configuration met the objective: " + KEEP + " (or relax the objective)"
    if confirmation is None:
        return None, "today's settings did best: " + KEEP
    if not confirmation.recommend:
        return None, (
            f"the gain ({confirmation.ratio:.2f}x, 95% lower bound "
            f"{confirmation.lower_bound:.2f}x) did not hold with confidence: " + KEEP
        )
    return best, f"apply recommended.env ({best.label()}): {confirmation.ratio:.2f}x goodput"


def _write_outputs(
    plan_: Plan,
    rows: Sequence[Row],
    trials: Sequence[Trial],
    best: Config | None,
    confirmation: Confirmation | None,
    pairs: int,
    minutes: float,
    failed: str | None = None,
) -> int:
    from sluicegate.tuning.plot import write_pareto

    recommended, said = verdict(best, confirmation, failed)
    out = plan_.out
    header = (
        f"sluicegate tune {plan_.profile_name} --slo ttft_p90={plan_.objective.ttft}s,"
        f"itl_p90={plan_.objective.itl}s: {said}"
    )
    write_recommended_env(out / "recommended.env", recommended or Config(), header)
    write_trials_csv(out / "trials.csv", rows, machine_info())
    summary = (
        f"{plan_.profile_name}: {len(plan_.profile.requests)} engine requests over "
        f"{plan_.profile.span:.0f} s ({pairs} confirmation pairs planned)"
    )
    write_report(
        out / "report.md",
        profile_summary=summary,
        objective=plan_.objective,
        rows=rows,
        today=Config(),
        recommended=recommended,
        ratio=confirmation.ratio if confirmation else None,
        lower_bound=confirmation.lower_bound if confirmation else None,
        verdict=said,
        minutes=minutes,
    )
    write_pareto(
        out / "pareto.html", out / "pareto.png", rows, plan_.objective, Config(), recommended,
        f"sluicegate tune: {plan_.profile_name}",
    )  # fmt: skip
    for name in ("report.md", "trials.csv", "recommended.env", "pareto.html", "pareto.png"):
        print(f"  {out / name}", file=sys.stderr)
    print(said)
    return 3 if best is None else 0
