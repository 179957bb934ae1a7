"""A request's timeline: when it reached each stage of being served, and the phases between.

The marks, each a `time.perf_counter()` on the `RequestRecord`:

- `started`: the request arrived (`http.telemetry`);
- `prepared`: its prompts are rendered, tokenized and fitted to the budget (`inference.service`);
- `handed`: its run was handed to the engine, after admission and the cache (`inference.telemetry`);
- `queued`, `scheduled`, `engine_first_token`: the engine's own times, where it reports them
  (vLLM's request stats: its engine core took the request, scheduled it first, and produced
  its first token; an upstream reports none);
- `first_token`: that first token reached the gateway;
- `first_byte`: the first byte of the response body was sent (`http.telemetry`).

A phase runs from one mark to the next that is there, so the phases of a request add up to
its time to first byte. They are observed in `sluicegate_request_phase_seconds{model,
phase}` once the request ends, for requests the engine answered (not cache hits), and added
to the request's span as events at their marks when tracing is on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import cache

from opentelemetry.trace import Span
from prometheus_client.metrics import Histogram

from sluicegate.observability import metrics
from sluicegate.observability.record import RequestRecord

PHASES: tuple[tuple[str, str], ...] = (
    ("prepare", "prepared"),
    ("wait", "handed"),
    ("hand_off", "queued"),
    ("queue", "scheduled"),
    ("prefill", "engine_first_token"),
    ("deliver", "first_token"),
    ("write", "first_byte"),
)
"""Each phase and the mark that ends it, in the order of the timeline."""


def phases(record: RequestRecord) -> Iterator[tuple[str, float]]:
    """Each phase whose ending mark is set, and its seconds from the mark before it."""
    last = record.started
    for phase, mark in PHASES:
        at: float | None = getattr(record, mark)
        if at is None:
            continue
        yield phase, max(0.0, at - last)
        last = max(last, at)


@cache
def _histogram(model: str, phase: str) -> Histogram:
    return metrics.REQUEST_PHASE.labels(model, phase)


def observe(record: RequestRecord, model: str) -> None:
    """Observe the phases of a request the engine answered."""
    if record.first_token is None:
        return
    for phase, seconds in phases(record):
        _histogram(model, phase).observe(seconds)


def add_events(span: Span, record: RequestRecord) -> None:
    """The marks as events of `span` (a recording one), at their own times."""
    now_ns, now = time.time_ns(), time.perf_counter()
    for _, mark in PHASES:
        at: float | None = getattr(record, mark)
        if at is not None:
            span.add_event(mark, timestamp=now_ns - int((now - at) * 1e9))
