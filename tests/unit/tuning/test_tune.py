"""`sluicegate tune`: what it refuses before anything starts (exit 2, naming the problem), and
whole tunes over fake gateways (the fake engine's apps behind the process handle): outputs
written, the verdict on the last line, exit 0 when something met the objective and 3 when
nothing did."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.tuning import space, tune
from sluicegate.tuning.profile import Profile, Request
from sluicegate.tuning.search import Config
from sluicegate.tuning.trials import WARM_UP
from sluicegate.tuning.tune import KEEP, Plan, plan, run_tune
from tests.support.fakes import FakeEngine
from tests.support.tune_gateways import FakeGateway, gateways


def profile(path: Path, count: int = 200, span: float = 0.5) -> Path:
    requests = tuple(
        Request(round(i * span / count, 4), 12, 3, 3, True, "chat", 0, "MISS", "length", ())
        for i in range(count)
    )
    Profile(requests, header={"max_model_len": 64, "sample": 1.0}).write(path)
    return path


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder without a .env, and no tune that gets as far as a gateway."""
    monkeypatch.chdir(tmp_path)
    for name in ("SLUICEGATE_UPSTREAM_URLS", "SLUICEGATE_MODELS_FILE"):
        monkeypatch.delenv(name, raising=False)

    async def never(*_: object, **__: object) -> int:
        raise AssertionError("the tune started")

    monkeypatch.setattr(tune, "run_tune", never)
    return tmp_path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--slo", "ttft_p90=2s", "--budget", "5m"], "the objective needs itl_p90"),
        (["--slo", "ttft_p90=2s,itl_p90=3", "--budget", "5m"], "'3' is not a duration"),
        (["--slo", "ttft_p90=2s,itl_p90=300ms", "--budget", "soon"], "'soon' is not a duration"),
    ],
)
def test_bad_arguments_exit_2_naming_them(
    here: Path, args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(profile(here / "p.jsonl")), *args]) == 2
    assert said in capsys.readouterr().err


def test_a_bad_profile_exits_2_naming_its_line_and_field(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = profile(here / "p.jsonl")
    lines = path.read_text().splitlines()
    lines[7] = lines[7].replace('"input_tokens": 12', '"input_tokens": "12"')
    path.write_text("\n".join(lines) + "\n")
    assert main(["tune", str(path), "--slo", "ttft_p90=2s,itl_p90=1s", "--budget", "5m"]) == 2
    assert "line 8: input_tokens" in capsys.readouterr().err
    assert main(["tune", "missing.jsonl", "--slo", "ttft_p90=2s,itl_p90=1s", "--budget", "5m"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_what_a_trial_gateway_must_not_take_is_refused(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "tune",
        str(profile(here / "p.jsonl")),
        "--slo",
        "ttft_p90=2s,itl_p90=1s",
        "--budget",
        "5m",
    ]
    (here / ".env").write_text("SLUICEGATE_REDIS_URL=redis://127.0.0.1:6379/0\n")
    assert main(args) == 2
    assert "SLUICEGATE_REDIS_URL" in capsys.readouterr().err
    (here / ".env").unlink()
    monkeypatch.setenv("SLUICEGATE_UPSTREAM_URLS", "http://127.0.0.1:9/v1")
    assert main(args) == 2
    assert "in-process engine" in capsys.readouterr().err
    monkeypatch.delenv("SLUICEGATE_UPSTREAM_URLS")
    (here / "out").mkdir()
    (here / "out" / "x").write_text("")
    assert main([*args, "--out", str(here / "out")]) == 2
    assert "not empty" in capsys.readouterr().err


@contextlib.contextmanager
def tuned(
    here: Path, monkeypatch: pytest.MonkeyPatch, engine: FakeEngine, slo: str
) -> Iterator[tuple[Plan, list[FakeGateway]]]:
    """A plan over a short profile, a grid of one step per engine knob (a whole tune in a few
    seconds), and fake gateways for every start it asks for (reused once stopped)."""
    monkeypatch.setattr(space, "SEQS", (16,))
    monkeypatch.setattr(space, "BATCHED_TOKENS", (4096,))
    checked = plan({
        "profile": str(profile(here / "p.jsonl")),
        "slo": slo,
        "budget": "3m",
        "out": here / "out",
        "seed": 0,
    })  # fmt: skip
    with gateways(*(FakeEngine(delays=engine.delays) for _ in range(3))) as made:
        yield checked, made


def starter(pool: list[FakeGateway]) -> tune.Starter:
    """Today's gateway first, then the others in turn (one trial gateway runs at a time,
    the confirmation's candidate beside today's)."""
    turn = itertools.cycle(pool[1:])
    given = iter([pool[0]])

    def start(engine: Config, log: Path) -> FakeGateway:
        gateway = next(given, None) or next(turn)
        gateway.events.append(f"{engine.label()} -> {log.name}")
        return gateway

    return start


async def test_a_tune_where_all_meet_the_objective_writes_everything_and_says_what_to_do(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with tuned(here, monkeypatch, FakeEngine(), "ttft_p90=1s,itl_p90=1s") as (checked, pool):
        code = await run_tune(checked, starter(pool), words=range(10, 900))
    assert code == 0
    out = here / "out"
    for name in ("recommended.env", "trials.csv", "report.md", "pareto.html", "pareto.png"):
        assert (out / name).stat().st_size > 0, name
    said = capsys.readouterr().out.strip().splitlines()[-1]
    # The fake engines are alike: no configuration can win with confidence.
    assert said.endswith(KEEP)
    assert (out / "report.md").read_text().strip().splitlines()[-1].endswith(KEEP)
    assert not [
        line for line in (out / "recommended.env").read_text().splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    rows = list(csv.DictReader((out / "trials.csv").open()))
    stages = {row["stage"] for row in rows}
    assert "search" in stages
    # Today's gateway started first and was the one every admission trial ran on.
    assert pool[0].events[0] == "today's settings -> today.log"
    assert pool[0].events[-1] == "stop"


async def test_nothing_meeting_the_objective_exits_3_with_the_plot(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every answer starts 0.3 s late, the objective wants 0.1 s.
    slow = FakeEngine(delays=[0.3, 0.0, 0.0])
    with tuned(here, monkeypatch, slow, "ttft_p90=100ms,itl_p90=1s") as (checked, pool):
        code = await run_tune(checked, starter(pool), words=range(10, 900))
    assert code == 3
    assert (here / "out" / "pareto.png").read_bytes().startswith(b"\x89PNG")
    assert "no configuration met the objective" in (here / "out" / "report.md").read_text()
    assert all(g.events[-1] == "stop" for g in pool if g.events)


def test_the_verdict_recommends_only_a_gain_that_holds() -> None:
    from sluicegate.tuning.confirm import summarize

    best = Config.of({"max_num_seqs": 16})
    assert tune.verdict(None, None)[0] is None
    assert tune.verdict(Config(), None)[1].endswith(KEEP)
    held = summarize([1.4, 1.5, 1.45, 1.5])
    assert tune.verdict(best, held)[0] == best
    shaky = summarize([0.8, 1.9, 1.1, 1.6])
    assert tune.verdict(best, shaky) == (None, tune.verdict(best, shaky)[1])
    assert tune.verdict(best, shaky)[1].endswith(KEEP)


def test_a_sampled_capture_replays_at_the_rate_it_saw(here: Path) -> None:
    requests = tuple(
        Request(float(i), 12, 3, 3, True, "chat", 0, "MISS", "stop", ()) for i in range(4)
    )
    sampled = tune._sampled(Profile(requests, header={"sample": 0.25}))
    assert [r.t for r in sampled.requests] == [0.0, 0.25, 0.5, 0.75]
    whole = Profile(requests, header={"sample": 1.0})
    assert tune._sampled(whole) is whole


async def test_a_budget_too_short_for_a_first_round_exits_2_once_today_has_started(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with tuned(here, monkeypatch, FakeEngine(), "ttft_p90=1s,itl_p90=1s") as (checked, pool):
        # Today's engine took most of the budget to start: nothing can be tried after it.
        pool[0].started_in = 170.0
        short = dataclasses.replace(checked, budget=180.0)
        code = await run_tune(short, starter(pool), words=range(10, 900))
    assert code == 2
    assert "give at least --budget" in capsys.readouterr().err
    # Warmed, and primed once to learn what a run's start costs.
    assert pool[0].events[-1] == "stop" and len(pool[0].engine.prompts) == 3 * WARM_UP


def test_todays_slow_streams_on_the_first_window_decide_the_engine_order() -> None:
    from sluicegate.tuning.objective import Score
    from sluicegate.tuning.search import Trial
    from sluicegate.tuning.tune import streams_missed

    def ran(config: Config, window: int, starts: int, streams: int) -> Trial:
        met = 40 - starts - streams
        score = Score(1.0, met / 40, 0.5, 1.0, 1.5, 0.2, 50.0, 0, 0, met, 40, starts, streams)
        return Trial(config, window, score, 30.0, stopped_early=True)

    other = Config.of({"ttft_objective": 1.0})
    assert streams_missed([ran(other, 0, 0, 9), ran(Config(), 0, 2, 7)])
    assert not streams_missed([ran(Config(), 0, 5, 5)])
    assert not streams_missed([ran(Config(), 1, 0, 9)])  # not the first window
    assert not streams_missed([])
