"""Admission by the engine's own state: its waiting queue, its running batch, its KV cache.

A fixed bound on requests in flight (`http.admission`) says nothing of what they cost the
engine. These bounds read the engine's scheduler after its latest step (`EngineClient.load`)
and turn a new request away at once, before any engine work, when the engine already holds
as much as the operator allows:

- `max_waiting`: requests queued behind a full batch wait for whole requests to finish; past
  a few, their first token comes late whatever the objective says;
- `max_running`: a bigger batch makes every step, so every stream's next token, slower
  (requests waiting count too: they join the batch at the next step there is room);
- `max_kv_cache_usage`: when the KV cache fills, vLLM preempts running requests (their work
  is recomputed later), so new prompts are better refused just before that.

The waiting and running bounds count only what a new request would wait behind, and refuse
the key that holds it first, as the TTFT objective does (`prefill_queue.Backlog`): of the
requests waiting in the engine, those of its engine priority or lower (vLLM's scheduler says
only how many wait, so the gateway's own runs waiting for a first token tell which: at most
those ahead of it, plus any the gateway does not know of); a key holding at least its even
part of them is refused at the bound, another only past `NOT_HOLDER_SLACK` times it. The KV
cache bound is the engine's as a whole: preemption does not look at keys.

The refusal is a 503 `overloaded` with a `Retry-After` of how long the engine takes to start
what waits (the prefill queue's drain time), at least a second. Where the engine's state is
not known (an upstream) nothing is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.engine.protocol import EngineLoad
from sluicegate.errors import OverloadedError
from sluicegate.inference.prefill_queue import Backlog, retry_after, slack
from sluicegate.observability import metrics


@dataclass(frozen=True, slots=True)
class LoadLimits:
    max_waiting: int | None = None
    max_running: int | None = None
    max_kv_cache_usage: float | None = None
    """0 to 1."""

    @property
    def any(self) -> bool:
        return (
            self.max_waiting is not None
            or self.max_running is not None
            or self.max_kv_cache_usage is not None
        )

    def check(
        self,
        load: EngineLoad | None,
        drain_seconds: float | None,
        backlog: Backlog | None = None,
    ) -> None:
        """Raise `OverloadedError` if `load` is at a bound for a request that would wait
        behind `backlog` (everything waiting when None); `drain_seconds` gives Retry-After."""
        if load is None:
            return
        if backlog is None:
            backlog = Backlog(runs=load.waiting, own_runs=load.waiting, all_runs=load.waiting)
        # The engine's waiting requests ahead: at most the gateway's runs ahead, plus those
        # it does not know of.
        waiting = min(load.waiting, backlog.runs) + max(0, load.waiting - backlog.all_runs)
        holds = backlog.holds_runs
        if self.max_waiting is not None and waiting >= slack(self.max_waiting, holds):
            _refuse(
                "engine_waiting",
                f"{waiting} requests are waiting for the engine ahead of this one (at most "
                f"{self.max_waiting} may).",
                drain_seconds,
            )
        # What waits joins the batch at the next step if there is room: the batch a new
        # request would make is at least the lesser of the two (and MAX_NUM_SEQS caps it).
        batch = load.running + waiting
        if self.max_running is not None and batch >= slack(self.max_running, holds):
            _refuse(
                "engine_running",
                f"the engine runs or is about to run {batch} requests (at most "
                f"{self.max_running} at once).",
                drain_seconds,
            )
        usage = self.max_kv_cache_usage
        if usage is not None and load.kv_cache_usage >= usage:
            _refuse(
                "kv_cache",
                f"the engine's KV cache is {load.kv_cache_usage:.0%} full (new requests stop at "
                f"{usage:.0%}).",
                drain_seconds,
            )


def _refuse(reason: str, why: str, drain_seconds: float | None) -> None:
    metrics.ADMISSION_REFUSED.labels(reason).inc()
    retry = retry_after(drain_seconds)
    raise OverloadedError(
        f"The server is overloaded: {why} Retry in {retry} s.",
        headers={"retry-after": str(retry)},
    )
