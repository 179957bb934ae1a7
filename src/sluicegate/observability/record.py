"""What one request's access line and timeline need, filled in by whoever learns it while
it is served.

`TelemetryMiddleware` opens a `RequestRecord` for each HTTP request and makes it current
(a context variable, so it follows the request into the tasks it starts); the service marks
when the request was prepared, the engine-run hook adds token counts and the engine's times,
and the middleware the first byte sent (`observability.timeline` makes phases of them). Code
with no current request (unit tests of the service, background work) gets None and records
nothing.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from prometheus_client import Gauge

from sluicegate.observability.metrics import REQUESTS_IN_FLIGHT
from sluicegate.observability.traffic_entry import TrafficEntry


@dataclass(slots=True)
class RequestRecord:
    started: float = field(default_factory=time.perf_counter)
    """`time.perf_counter()` when the request arrived (its headers)."""
    body_wait: float = 0.0
    """Seconds the app waited for the client to send the request's body: the client's time,
    not the gateway's."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token: float | None = None
    """`time.perf_counter()` when the engine produced the request's first token."""
    # The request's timeline (`observability.timeline`), each a `time.perf_counter()`.
    prepared: float | None = None
    handed: float | None = None
    queued: float | None = None
    scheduled: float | None = None
    engine_first_token: float | None = None
    first_byte: float | None = None
    engine_finished: float | None = None
    """`time.perf_counter()` when the engine's run ended (the last one, after a fallback)."""
    overhead: float | None = None
    """Seconds the gateway itself spent on the request before its response began: the time
    to the response's start less the engine's (`http.telemetry.overhead`)."""
    model: str | None = None
    """The served model the request was routed to (its metrics' `model` label)."""
    in_flight: str | None = None
    """The `model` label it counts in flight under, while it does."""
    cached_tokens: int = 0
    """Prompt tokens answered from the response or embedding cache (the usage ledger's
    `cached_input_tokens`)."""
    traffic: TrafficEntry | None = None
    """What the traffic capture records of it (`observability.capture`); None when it is
    off, or the request is on no captured path."""
    slow_gap: float | None = None
    """The service objective's bound on a gap between tokens (`SLO_ITL`): with it, the
    engine's steps count `gaps` and those past it, `slow_gaps` (`observability.objective`)."""
    gaps: int = 0
    slow_gaps: int = 0

    def add_usage(self, prompt_tokens: int, completion_tokens: int, cached: int = 0) -> None:
        self.prompt_tokens = (self.prompt_tokens or 0) + prompt_tokens
        self.completion_tokens = (self.completion_tokens or 0) + completion_tokens
        self.cached_tokens += cached


def enter_in_flight(record: RequestRecord) -> None:
    """An inference request has arrived: it counts in flight, under no model until its route
    knows which (`mark_model`)."""
    record.in_flight = ""
    _in_flight("").inc()


def mark_model(name: str) -> None:
    """The current request is served by the model `name` (another one, after a fallback):
    it counts in flight for that model until it ends (`TelemetryMiddleware`)."""
    record = _current.get()
    if record is None or record.model == name:
        return
    record.model = name
    if record.in_flight is not None:
        _in_flight(record.in_flight).dec()
        record.in_flight = name
        _in_flight(name).inc()


def end_model(record: RequestRecord) -> None:
    """The request has ended: it is no longer in flight."""
    if record.in_flight is not None:
        _in_flight(record.in_flight).dec()
        record.in_flight = None


_IN_FLIGHT: dict[str, Gauge] = {}


def _in_flight(model: str) -> Gauge:
    """The labelled child, looked up once: `labels()` costs more than the increment. Model
    names come from the registry, so the children are bounded."""
    child = _IN_FLIGHT.get(model)
    if child is None:
        child = _IN_FLIGHT[model] = REQUESTS_IN_FLIGHT.labels(model)
    return child


def mark_prepared() -> None:
    """The current request's prompts are rendered, tokenized and fitted to the budget."""
    record = _current.get()
    if record is not None and record.prepared is None:
        record.prepared = time.perf_counter()


_current: ContextVar[RequestRecord | None] = ContextVar("sluicegate_request", default=None)


def current_request() -> RequestRecord | None:
    """The record of the request being served in this context, if any."""
    return _current.get()


def open_request(record: RequestRecord) -> Token[RequestRecord | None]:
    return _current.set(record)


def close_request(token: Token[RequestRecord | None]) -> None:
    _current.reset(token)
