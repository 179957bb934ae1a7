"""Per-request telemetry as pure-ASGI middleware: request metrics and one access-log line.

For every HTTP request: `sluicegate_requests_total{endpoint, model, status}`, and for the
inference routes the in-flight gauge (under no model until the route knows which:
`record.mark_model`), the end-to-end latency of successes and the client disconnects.
`endpoint` is the route template (`/v1/models/{model_id}`), never the raw path; `model` is
the model the request was routed to (a registry name, never an alias or what the client
typed) on the inference routes, and empty elsewhere or when it was refused before routing,
so labels stay few. A response that never completes, because the client left, counts as
status 499, like a non-streamed request whose client left.

The access line carries the request id, trace id, status, model, token counts, the time the
gateway waited for the client to send its body, TTFT, total time (both from the headers) and
cache outcome (the `X-Cache` response header). Never a body, a header value other
than `X-Cache`, or a key. Probes and scrapes (`/health`, `/ready`, `/metrics`) log at DEBUG.

With `TRAFFIC_CAPTURE` on, each inference request's arrival and end are told to the traffic
capture (`observability.capture`), which keeps their order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from prometheus_client import Counter, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.errors import AuthenticationError
from sluicegate.http.asgi import api_key_id, header
from sluicegate.http.state import app_state
from sluicegate.lru import BoundedLRU
from sluicegate.observability import metrics, timeline
from sluicegate.observability.logs import lean_record
from sluicegate.observability.objective import ServiceObjective
from sluicegate.observability.record import (
    RequestRecord,
    close_request,
    end_model,
    enter_in_flight,
    open_request,
)
from sluicegate.paths import INFERENCE_PATHS, PROBE_PATHS

access_logger = logging.getLogger("sluicegate.access")

CLIENT_CLOSED = 499
UNMATCHED = "unmatched"
_CACHE_HEADER = b"x-cache"


OVERHEAD_HEADER = b"x-sluicegate-overhead-duration-ms"


def overhead(record: RequestRecord, now: float) -> float:
    """Seconds the gateway itself spent on the request before `now`, when its response
    begins: the time since it arrived less the wait for the client to send its body and
    the engine's part, from the run's hand-off to its first token (a stream), its end (an
    answer sent whole) or `now` (a stream whose headers went out before its first token).
    The client's upload of its body is the client's; waiting for admission is the
    gateway's (the `wait` phase of `observability.timeline` tells it apart)."""
    spent = now - record.started - record.body_wait
    if record.handed is not None:
        engine_end = record.engine_finished or record.first_token or now
        spent -= max(0.0, min(engine_end, now) - record.handed)
    return max(0.0, spent)


def _overhead_header(seconds: float) -> tuple[bytes, bytes]:
    return OVERHEAD_HEADER, b"%.3f" % (seconds * 1000)


class TelemetryMiddleware:
    """Sits just inside `RequestIdMiddleware`, so even refusals by the other middleware count."""

    def __init__(self, app: ASGIApp):
        self.app = app
        # Requests answered before routing (middleware refusals, cache hits) carry no route;
        # matching them against every route again is a cost on the hottest path.
        self._matched: BoundedLRU[tuple[str, str], str] = BoundedLRU(_MAX_MATCHED)
        # Labelled children, looked up once: `labels()` costs more than the increment.
        self._counters: dict[tuple[str, str, int], Counter] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._overheads: dict[str, Histogram] = {}
        self._judged: dict[tuple[str, str], Counter] = {}

    def _endpoint(self, scope: Scope) -> str:
        if scope.get("route") is not None:
            return _endpoint(scope, _routes(scope))
        key = (scope["method"], scope["path"])
        found = self._matched.get(key)
        if found is None:
            found = _endpoint(scope, _routes(scope))
            if found != UNMATCHED:
                self._matched.put(key, found)
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord()
        response = _Response()
        inference = scope["path"] in INFERENCE_PATHS

        async def observed_receive() -> Message:
            # Time spent here is the client's: its body is not all in yet (or it left).
            called = time.perf_counter()
            message = await receive()
            if message["type"] == "http.request":
                record.body_wait += time.perf_counter() - called
            return message

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if inference:
                    record.overhead = overhead(record, time.perf_counter())
                    headers = [*message.get("headers", ()), _overhead_header(record.overhead)]
                    message = {**message, "headers": headers}
                response.start(message)
            elif message["type"] == "http.response.body":
                if record.first_byte is None and message.get("body"):
                    record.first_byte = time.perf_counter()
                if not message.get("more_body"):
                    response.finished = time.perf_counter()
            await send(message)

        token = open_request(record)
        capture = None
        objective = None
        if inference:
            enter_in_flight(record)
            if (state := app_state(scope)) is not None:
                if capture := state.capture:
                    capture.arrived(record, scope["path"])
                if objective := state.objective:
                    record.slow_gap = objective.itl
        try:
            await self.app(scope, observed_receive, observed_send)
        except BaseException:
            response.status = 500
            raise
        finally:
            close_request(token)
            end_model(record)
            if capture is not None:
                capture.ended(record)
            self._account(scope, record, response, objective)

    def _account(
        self,
        scope: Scope,
        record: RequestRecord,
        response: _Response,
        objective: ServiceObjective | None = None,
    ) -> None:
        endpoint = self._endpoint(scope)
        # The model the route resolved (empty when it was refused before, or off the
        # inference routes): names come from the registry, so the label set is bounded.
        model = (record.model or "") if endpoint in INFERENCE_PATHS else ""
        complete = response.finished is not None
        status = response.status if complete or response.status >= 500 else CLIENT_CLOSED
        ended = response.finished or time.perf_counter()
        counted = self._counters.get((endpoint, model, status))
        if counted is None:
            counted = metrics.REQUESTS.labels(endpoint, model, str(status))
            self._counters[(endpoint, model, status)] = counted
        counted.inc()
        if record.overhead is not None:
            observed = self._overheads.get(model)
            if observed is None:
                observed = self._overheads[model] = metrics.GATEWAY_OVERHEAD.labels(model)
            observed.observe(record.overhead)
        if endpoint in INFERENCE_PATHS and status != AuthenticationError.status_code:
            _settled(scope, record, model, status)
            if objective is not None and (outcome := objective.judge(record, status, ended)):
                judged = self._judged.get((model, outcome))
                if judged is None:
                    judged = metrics.OBJECTIVE_REQUESTS.labels(model, outcome)
                    self._judged[(model, outcome)] = judged
                judged.inc()
        if status == CLIENT_CLOSED:
            metrics.CLIENT_DISCONNECTS.labels(endpoint, model).inc()
        elif model and status < 400:
            timed = self._durations.get((endpoint, model))
            if timed is None:
                timed = metrics.REQUEST_DURATION.labels(endpoint, model)
                self._durations[(endpoint, model)] = timed
            timed.observe(ended - record.started)
            if record.first_token is not None:
                timeline.observe(record, model)
                span = trace.get_current_span()
                if span.is_recording():
                    timeline.add_events(span, record)
        level = logging.DEBUG if scope["path"] in PROBE_PATHS else logging.INFO
        if access_logger.isEnabledFor(level):
            fields = _access_fields(scope, record, response, model, status, ended)
            # Made and handled directly: `Logger.log` would first walk the stack for the
            # caller's file and line, which no access line shows, for a third of a cache
            # hit's time on the event loop; and made lean (`logs.lean_record`), not through
            # the process's record factory, which vLLM wraps with a lookup of its own.
            line = lean_record(
                access_logger.name, level, "%s %s", (scope["method"], scope["path"]), fields
            )
            access_logger.handle(line)


_MAX_MATCHED = 256


def _settled(scope: Scope, record: RequestRecord, model: str, status: int) -> None:
    """An inference request has ended, however it ended: what it used goes to the usage
    ledger (in memory: written in batches) and the per-key metrics. A request refused for
    its key (401) is nobody's."""
    state = app_state(scope)
    if state is None:
        return
    key = api_key_id(scope)
    prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
    state.key_labels.settled(key, prompt, completion)
    if state.ledger is not None:
        error = status >= 400 and status != CLIENT_CLOSED
        state.ledger.record(key, model, prompt, completion, record.cached_tokens, error)


class _Response:
    __slots__ = ("cache", "finished", "status")

    def __init__(self) -> None:
        self.status = 500
        self.cache: str | None = None
        self.finished: float | None = None

    def start(self, message: Message) -> None:
        self.status = message["status"]
        cache = header(message.get("headers", ()), _CACHE_HEADER)
        self.cache = None if cache is None else cache.decode("latin-1")


def _routes(scope: Scope) -> Sequence[BaseRoute]:
    """The routes of the app serving the request (Starlette puts it in the scope)."""
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    return routes if isinstance(routes, list) else []


def _endpoint(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The route template the router chose, or would have chosen for a request that the
    middleware refused before routing."""
    route = scope.get("route")
    if route is None:
        partial = None
        for candidate in routes:
            match, _ = candidate.matches(scope)
            if match is Match.FULL:
                route = candidate
                break
            if match is Match.PARTIAL and partial is None:
                partial = candidate
        route = route or partial
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


def _access_fields(
    scope: Scope,
    record: RequestRecord,
    response: _Response,
    model: str,
    status: int,
    ended: float,
) -> dict[str, Any]:
    context = trace.get_current_span().get_span_context()
    ttft = None if record.first_token is None else record.first_token - record.started
    return {
        "status": status,
        "request_id": scope.get("state", {}).get("request_id"),
        "trace_id": trace.format_trace_id(context.trace_id) if context.is_valid else None,
        "model": model or None,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "body_wait_ms": round(record.body_wait * 1000, 1),
        "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
        "total_ms": round((ended - record.started) * 1000, 1),
        "cache": response.cache,
    }
