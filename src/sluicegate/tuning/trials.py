"""Trials on real gateways: the search's `TrialRunner` and the confirmation's `PairedRunner`.

Today's gateway is started once and kept for the whole tune; a configuration that changes
only admission bounds runs on it (its bounds set before the window, today's put back after).
One that changes an engine knob gets a gateway of its own for its trial, stopped after it;
while it runs, today's is frozen. The confirmation keeps both alive and freezes the idle one.
On a GPU host (`exclusive`) two engines do not fit beside each other: today's is stopped
while another runs, and started again after (the confirmation then restarts an engine at
each change of arm).

A trial replays one window of the search's traffic: the busiest 20, 40 and 80 s (rungs 0, 1,
2; at least 40, 80, 160 requests), each request's prompt drawn anew (a new salt a run) so
that no run finds the last one's prompts in the prefix cache, and every request cut at the
window's end plus `DRAIN` (and judged on what it had shown by then: a long answer still
streaming in time and at pace is no miss; `Outcome.cut`). It stops as soon as more
requests have missed than a configuration meeting the objective would miss in 19 runs of
20 (7 of 40, 13 of 80, 22 of 160: `objective.plausible_misses`): that configuration cannot
win. A new gateway answers `WARM_UP` short requests before it is measured, and after each
run a gateway is left to finish what it was doing. A candidate that does not start, or
dies, is a failed trial (all its requests missed); today's failing ends the tune.

Every run starts from the same state, whether its gateway is new or has run before (today's
through the whole search, both arms through the confirmation): the gateway forgets what its
admission measured (`POST /admin/admission/reset`) and answers the same burst of short
requests (`prime`), under today's bounds, before the run's bounds are set. Its TTFT estimate
is then learnt from that burst alone, not from the runs before (how late first tokens came
under another configuration's load; time with runs waiting and nothing drained, when a run
was stopped and its requests cancelled). Without this, the same configuration on the same
window met 90% as one trial on today's gateway and 35% as a later one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from sluicegate.tuning.gateways import GatewayFailed
from sluicegate.tuning.objective import Objective, Outcome, score
from sluicegate.tuning.outputs import Row
from sluicegate.tuning.profile import Profile, Request
from sluicegate.tuning.prompts import PromptMaker
from sluicegate.tuning.replay import Stopped, Target, replay
from sluicegate.tuning.search import Config, Trial, allowed_misses
from sluicegate.tuning.space import admission_part, engine_part

WINDOWS = ((20.0, 40), (40.0, 80), (80.0, 160))
"""What a rung replays: the busiest this many seconds of the search's traffic, and at least
this many requests (on a slow host the seconds alone hold too few to judge by)."""
CONFIRM_WINDOW = WINDOWS[0]
"""What a confirmation pair replays: the held-out traffic's busiest part, judged as the first
rung judges the search's. A longer, calmer window (30 s, a burst and a lull) once hid a gain
the search had found in the bursts, where the knobs matter: today's settings met 98-100%
there."""
WARM_UP = 8
"""Requests a new gateway answers, one at a time, before its first run; and every gateway
twice as many at once before each run (`prime`: more than the TTFT estimate needs before it
refuses anything, `prefill_queue.QueueConfig.min_samples`)."""
WARM_UP_TOKENS = 16
"""Each warm-up request's output, at most (its prompt is one of the traffic's)."""
DRAIN = 15.0
"""At most this long after a window's last arrival for its requests to end (they are cut
past the window plus this, and judged on what they had shown)."""


def note(text: str) -> None:
    print(f"sluicegate: {text}", file=sys.stderr, flush=True)


class Gateway(Protocol):
    """A gateway a trial runs on (`gateways.GatewayProcess`; a fake in the tests)."""

    @property
    def url(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def started_in(self) -> float: ...
    @property
    def exited(self) -> bool: ...

    async def start(self) -> None: ...
    async def settle(self) -> bool: ...
    async def forget(self) -> None: ...
    async def set_admission(self, bounds: Mapping[str, object]) -> None: ...
    def freeze(self) -> None: ...
    async def thaw(self) -> None: ...
    async def stop(self) -> None: ...


Launch = Callable[[Config, str], Awaitable[Gateway]]
"""Starts a gateway with these engine knobs; the string names it (for its log)."""


def busiest(requests: Sequence[Request], seconds: float, at_least: int = 0) -> list[Request]:
    """The `seconds` of `requests` with the most arrivals or, when those are fewer than
    `at_least`, the shortest span that holds `at_least`; rebased to start at 0 (all of them
    when there are no more)."""
    if len(requests) <= max(at_least, 1):
        return [_moved(r, r.t - requests[0].t) for r in requests]
    best_start = best_count = 0
    end = 0
    for start, request in enumerate(requests):
        while end < len(requests) and requests[end].t < request.t + seconds:
            end += 1
        if end - start > best_count:
            best_start, best_count = start, end - start
    if best_count < at_least:
        spans = range(len(requests) - at_least + 1)
        best_start = min(spans, key=lambda i: requests[i + at_least - 1].t - requests[i].t)
        best_count = at_least
    chosen = requests[best_start : best_start + best_count]
    origin = chosen[0].t
    return [_moved(r, r.t - origin) for r in chosen]


def _moved(request: Request, t: float) -> Request:
    return replace(request, t=round(t, 6))


@dataclass
class GatewayTrials:
    """Runs configurations on gateways; `rows` keeps every replay in order."""

    launch: Launch
    today: Gateway
    today_bounds: dict[str, object]
    """Today's admission bounds (what `today` is put back to after a trial)."""
    search_part: Profile
    held_out: Profile
    objective: Objective
    vocabulary: Sequence[int]
    scheduling_policy: str = "fcfs"
    """Today's; a run sends the requests' priorities only to an engine scheduling by them."""
    exclusive: bool = False
    """One engine at a time (a GPU host): today's is stopped, not frozen, while another runs."""
    on_row: Callable[[Row], None] | None = None
    rows: list[Row] = field(default_factory=list)
    _salt: int = 0
    _primed_in: float = 0.0
    """Seconds the last `prime` took (each run starts with one)."""
    _slack: float = 0.0
    """What runs have lately taken beyond their estimated cost (warm-ups, drains, stops)."""
    _candidate: Gateway | None = None
    _candidate_config: Config | None = None

    def window(self, rung: int) -> list[Request]:
        return busiest(self.search_part.requests, *WINDOWS[rung])

    def held_out_window(self) -> list[Request]:
        return busiest(self.held_out.requests, *CONFIRM_WINDOW)

    def cost(self, config: Config, window: int) -> float:
        """The window's traffic, half the drain, what runs have lately taken beyond that, and
        an engine start (as long as today's took) when the configuration needs one (two on a
        GPU host: today's again after it)."""
        requests = self.window(window)
        seconds = (requests[-1].t if requests else 0.0) + DRAIN / 2 + self._run_overhead()
        if engine_part(config).knobs:
            seconds += self.today.started_in * (2 if self.exclusive else 1)
        return seconds

    def pair_cost(self) -> float:
        """What one confirmation pair costs: two runs of the held-out window (and, on a GPU
        host, an engine start for each)."""
        requests = self.held_out_window()
        run = (requests[-1].t if requests else 0.0) + DRAIN / 2 + self._run_overhead()
        return 2 * (run + (self.today.started_in if self.exclusive else 0.0))

    def _run_overhead(self) -> float:
        """What a run costs beyond its window and half the drain: its prime, and what runs
        have lately taken beyond their estimate."""
        return self._primed_in + self._slack

    async def run(self, config: Config, window: int) -> Trial:
        began = time.monotonic()
        estimate = self.cost(config, window)
        requests = self.window(window)
        name = f"trial-{len(self.rows) + 1}"
        outcomes: list[Outcome] = []
        stopped = True
        try:
            gateway = await self._gateway_for(config, name)
            try:
                outcomes, stopped = await self._replay(gateway, config, requests, early_stop=True)
            finally:
                if gateway is not self.today:
                    await gateway.stop()
        except GatewayFailed as exc:
            if not engine_part(config).knobs:
                raise
            note(f"{config.label()}: {exc}; counted as a failed trial")
        finally:
            if engine_part(config).knobs:
                await self._today_back()
        self._slack = max(0.0, (self._slack + time.monotonic() - began - estimate) / 2)
        row = self._record("search", window, 0, "trial", config, requests, outcomes, stopped)
        return Trial(config, window, row.score, time.monotonic() - began, stopped)

    async def met(self, config: Config, pair: int) -> int:
        """`PairedRunner`: the held-out window's busiest part with `config`; requests met."""
        requests = self.held_out_window()
        gateway = await self._paired_gateway(config)
        outcomes, _ = await self._replay(gateway, config, requests, early_stop=False)
        arm = "today" if not config.knobs else "candidate"
        self._record("confirm", -1, pair, arm, config, requests, outcomes, False)
        return sum(self._met(o) for o in outcomes)

    async def started(self, engine: Config, name: str) -> Gateway:
        """A gateway launched with these engine knobs, and warmed up."""
        gateway = await self.launch(engine, name)
        await self.warm(gateway)
        return gateway

    async def warm(self, gateway: Gateway) -> None:
        """`WARM_UP` of the traffic's prompts, short answers, one after another, before
        anything is measured: an engine's first requests are slower than the rest (kernels
        loaded, memory touched)."""
        target, short, prompts = self._warm_up(gateway)
        for request in short:
            await replay(target, [request], prompts)

    async def prime(self, gateway: Gateway) -> None:
        """Before every run: the gateway's admission measurements forgotten and today's
        bounds set, then twice `WARM_UP` short requests at once, from which its TTFT
        estimate is learnt anew (as many departures as it needs:
        `prefill_queue.QueueConfig.min_samples`). On a new gateway this also makes the
        engine's kernels for a batch's sizes, which no trial must pay for."""
        began = time.monotonic()
        await gateway.forget()
        await gateway.set_admission(self.today_bounds)
        target, short, prompts = self._warm_up(gateway)
        await replay(target, short + short, prompts)
        if not await gateway.settle():
            note("a gateway still had requests in flight after its warm-up")
        self._primed_in = time.monotonic() - began

    def _warm_up(self, gateway: Gateway) -> tuple[Target, list[Request], PromptMaker]:
        self._salt += 1
        prompts = PromptMaker(self.vocabulary, self.search_part.block_size, salt=self._salt)
        target = Target(gateway.url, gateway.model, timeout=120.0, headers=gateway.headers)
        short = [
            replace(r, t=0.0, output_tokens=min(r.output_tokens, WARM_UP_TOKENS))
            for r in self.search_part.requests[:WARM_UP]
        ]
        return target, short, prompts

    async def close(self) -> None:
        if self._candidate is not None:
            await self._candidate.stop()
            self._candidate = None

    async def _gateway_for(self, config: Config, name: str) -> Gateway:
        if not engine_part(config).knobs:
            return self.today
        await self._today_away()
        return await self.started(engine_part(config), name)

    async def _today_away(self) -> None:
        """Today's gateway out of the way of another engine: frozen, or on a GPU host
        stopped."""
        if self.exclusive:
            await self.today.stop()
        else:
            self.today.freeze()

    async def _today_back(self) -> None:
        if self.today.exited:
            self.today = await self.started(Config(), "today")
        else:
            await self.today.thaw()

    async def _paired_gateway(self, config: Config) -> Gateway:
        """Both gateways alive through the confirmation, the one not replaying frozen (on a
        GPU host, stopped, and started again when its arm comes)."""
        if not engine_part(config).knobs:
            if self._candidate is not None:
                if self.exclusive:
                    await self.close()
                else:
                    self._candidate.freeze()
            await self._today_back()
            return self.today
        if self._candidate is not None and self._candidate_config != engine_part(config):
            await self.close()
        await self._today_away()
        if self._candidate is None:
            self._candidate = await self.started(engine_part(config), "candidate")
            self._candidate_config = engine_part(config)
        await self._candidate.thaw()
        return self._candidate

    async def _replay(
        self, gateway: Gateway, config: Config, requests: list[Request], early_stop: bool
    ) -> tuple[list[Outcome], bool]:
        await self.prime(gateway)
        await gateway.set_admission({**self.today_bounds, **dict(admission_part(config).knobs)})
        self._salt += 1
        prompts = PromptMaker(self.vocabulary, self.search_part.block_size, salt=self._salt)
        policy = config.get("scheduling_policy", self.scheduling_policy)
        lowest = min((r.priority for r in self.search_part.requests), default=0)
        target = Target(
            gateway.url,
            gateway.model,
            timeout=requests[-1].t + DRAIN if requests else DRAIN,
            cut_at=requests[-1].t + DRAIN if requests else DRAIN,
            send_priority=policy == "priority",
            priority_offset=-lowest,
            headers=gateway.headers,
        )
        allowed = allowed_misses(len(requests))
        missed = 0

        def keep_going(outcome: Outcome) -> bool:
            nonlocal missed
            missed += not self._met(outcome)
            return missed <= allowed

        try:
            outcomes = await replay(
                target,
                requests,
                prompts,
                keep_going if early_stop else None,
                late_after=self.objective.ttft,
            )
            stopped = False
        except Stopped as stop:
            outcomes, stopped = stop.outcomes, True
        if gateway.exited:
            raise GatewayFailed("the gateway died during its run")
        if not await gateway.settle():
            note("a gateway still had requests in flight after a run: the next may start busy")
        if gateway is self.today:
            await gateway.set_admission(self.today_bounds)
        rejected = sum(o.rejected for o in outcomes)
        if rejected:
            # The replay sent what the gateway would not take: no configuration is to blame.
            raise GatewayFailed(f"the gateway rejected {rejected} replayed requests (4xx)")
        return outcomes, stopped

    def _met(self, outcome: Outcome) -> bool:
        return self.objective.missed_by(outcome) is None

    def _record(
        self,
        stage: str,
        rung: int,
        pair: int,
        arm: str,
        config: Config,
        requests: list[Request],
        outcomes: list[Outcome],
        stopped: bool,
    ) -> Row:
        offered = max(requests[-1].t, 1.0) if requests else 1.0
        # A run stopped early is judged on its whole window: what never came back missed.
        unheard = len(requests) - len(outcomes)
        row = Row(
            stage, rung, pair, arm, config, offered, len(requests),
            score(outcomes, self.objective, offered, unheard), stopped,
        )  # fmt: skip
        self.rows.append(row)
        if self.on_row is not None:
            self.on_row(row)
        return row
