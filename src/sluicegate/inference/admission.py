"""The gateway's admission bounds, and each engine's admission under them.

Four bounds turn a new run away at once, before any engine work: the TTFT objective
(`prefill_queue`) and the engine's waiting queue, running batch and KV cache
(`load_limits`). They are the settings' at start; with `ALLOW_RUNTIME_ADMISSION` an admin
changes them at run time (`PUT /admin/admission`, what `sluicegate tune` searches), with no
restart. One `Admission` holds them for the whole process, and one `EngineAdmission` per
engine (its prefill queue, its load limits), shared by the services of the engine's models.

A change applies to every engine at once (no await between them) and to the runs that come
after it. Nothing waits under these bounds: a run is admitted or refused when it arrives. So
a change lets no run in that was refused, and takes none out that was admitted: those keep
their places in the queue until their first token, whatever the new bounds say. A bound
lowered refuses the next runs; raised or unset, it admits them. What the queue measured (the
engine's drain rate, the lateness of first tokens) is the engine's and is kept, unless an
admin asks for it to be forgotten (`POST /admin/admission/reset`).

An engine that reports no scheduler state (an upstream) is bound by the TTFT objective
alone: the three engine bounds bound nothing there, set at start or at run time, and the
gateway says so.
"""

from __future__ import annotations

import logging

from sluicegate.engine.protocol import EngineClient
from sluicegate.inference.load_limits import LoadLimits
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig, QueueTicket
from sluicegate.wire.admission import AdmissionBounds

logger = logging.getLogger(__name__)

STATELESS_ENGINE = (
    "MAX_ENGINE_WAITING, MAX_ENGINE_RUNNING and MAX_KV_CACHE_USAGE read the in-process "
    "engine's scheduler; upstreams report none, so they bound nothing here"
)


class EngineAdmission:
    """One engine's admission: its prefill queue and its load limits, under the bounds."""

    __slots__ = ("engine", "limits", "queue")

    def __init__(self, engine: EngineClient, bounds: AdmissionBounds | None = None) -> None:
        """`bounds`: none by default (nothing refused; the queue is still measured)."""
        bounds = bounds or AdmissionBounds()
        self.engine = engine
        self.queue = PrefillQueue(QueueConfig(objective=bounds.ttft_objective))
        self.limits = _load_limits(bounds)

    def apply(self, bounds: AdmissionBounds) -> None:
        """The bounds of the runs admitted from now on; the frozen limits are replaced whole."""
        self.queue.set_objective(bounds.ttft_objective)
        self.limits = _load_limits(bounds)

    def admit(
        self, tokens: int, elapsed: float, *, learns: bool, priority: int, key: str
    ) -> QueueTicket:
        """A run's place in the queue, or `OverloadedError` when the engine holds as much as
        it may or the first token would come too late. Both count only the backlog the run
        would wait behind, and refuse the key that holds it first (`prefill_queue.Backlog`)."""
        load = self.engine.load()
        queue = self.queue
        self.limits.check(load, queue.drain_seconds(), queue.backlog(priority, key))
        in_step = load.step_seconds if load is not None and (load.running or load.waiting) else 0.0
        return queue.enter(tokens, elapsed, in_step, learns, priority, key)


class Admission:
    """The bounds of the whole process, and every engine's admission under them."""

    def __init__(self, bounds: AdmissionBounds | None = None) -> None:
        self._bounds = bounds or AdmissionBounds()
        self._engines: dict[int, EngineAdmission] = {}

    @property
    def bounds(self) -> AdmissionBounds:
        return self._bounds

    def of(self, engine: EngineClient) -> EngineAdmission:
        """The engine's admission, made at its first model: one per engine, so a base model
        and its adapters share theirs."""
        found = self._engines.get(id(engine))
        if found is None:
            found = self._engines[id(engine)] = EngineAdmission(engine, self._bounds)
            if _binds_engine_state(self._bounds) and engine.load() is None:
                logger.warning(STATELESS_ENGINE)
        return found

    def change(self, change: AdmissionBounds, by: str) -> AdmissionBounds:
        """Set the bounds `change` sets, unset those it unsets, keep the others, on every
        engine; `by` is the public id of the key that asked (logged, with what changed)."""
        before = self._bounds
        after = change.over(before)
        self._bounds = after
        for engine in self._engines.values():
            engine.apply(after)
        changed = "; ".join(f"{name} {old} -> {new}" for name, old, new in after.changes(before))
        logger.info("admission bounds changed by %s: %s", by, changed or "nothing changed")
        engines = self._engines.values()
        if _binds_engine_state(after) and all(e.engine.load() is None for e in engines):
            logger.warning(STATELESS_ENGINE)
        return after

    def forget(self, by: str) -> None:
        """What every engine's queue measured (the drain rate, the lateness of first tokens)
        forgotten, the bounds kept: the next runs are admitted as on new engines, until the
        queues have measured enough again. For a run that must not inherit what earlier load
        taught the estimate (`sluicegate tune`'s trials on one long-lived gateway)."""
        for engine in self._engines.values():
            engine.queue.forget()
        logger.info("admission measurements forgotten by %s", by)


def _load_limits(bounds: AdmissionBounds) -> LoadLimits:
    return LoadLimits(
        max_waiting=bounds.max_engine_waiting,
        max_running=bounds.max_engine_running,
        max_kv_cache_usage=bounds.max_kv_cache_usage,
    )


def _binds_engine_state(bounds: AdmissionBounds) -> bool:
    return _load_limits(bounds).any
