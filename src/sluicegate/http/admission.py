"""Admission control: a bound on connections served, and on inference requests in flight,
overall and per API key.

`ConnectionLimitMiddleware` refuses a request that came on a connection past
`MAX_CONNECTIONS` (which `http.connection` marks when it accepts it): a 503 `overloaded`
with `Retry-After`, before the API key check and the body, then the connection closes.
Health probes and scrapes on such a connection are still answered, so that an orchestrator
does not restart a replica for being busy.

`AdmissionMiddleware` bounds inference requests.

A slot is taken once the request's body has arrived (`http.body_limits` reads it first), so
a slow upload holds none. A request over the bound is refused at once: 503 `overloaded` when
the gateway is full, 503 `shutting_down` while it drains after SIGTERM, and 429
`concurrency_limit_exceeded` when one key holds its share. All carry `Retry-After`.
A slot is held until the response (or stream) has been sent, so the
count covers everything the engine is running or queueing for us. With several workers the
counts are shared by them (`counters.SharedTally`): the bounds hold for the whole gateway.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.counters import LocalTally, Tally
from sluicegate.errors import (
    ConcurrencyLimitError,
    GatewayError,
    OverloadedError,
    ShuttingDownError,
)
from sluicegate.http.asgi import api_key_id, over_connection_limit
from sluicegate.http.errors import send_error
from sluicegate.keys import ANONYMOUS
from sluicegate.lifecycle import Lifecycle
from sluicegate.observability.metrics import ADMISSION_REFUSED
from sluicegate.paths import INFERENCE_PATHS, PROBE_PATHS

RETRY_AFTER_S = "1"
_ALL, _KEY = "req", "req:"
"""The tally's count of all requests in flight, and the prefix of each key's."""
CONNECTIONS_REFUSED = "connections"
"""The `reason` of `sluicegate_admission_refused_total` for a connection past the limit."""


class ConnectionLimitMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not over_connection_limit(scope)
            or scope["path"] in PROBE_PATHS
        ):
            await self.app(scope, receive, send)
            return
        error = OverloadedError(
            "The server has too many open connections. Retry shortly.",
            headers={"retry-after": RETRY_AFTER_S},
        )
        await _refuse(send, error, scope, reason=CONNECTIONS_REFUSED)


class AdmissionMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        lifecycle: Lifecycle,
        max_in_flight: int,
        max_in_flight_per_key: int | None,
        tally: Tally | None = None,
    ):
        self.app = app
        self.lifecycle = lifecycle
        self.max_in_flight = max_in_flight
        self.max_per_key = max_in_flight_per_key
        self.tally = tally or LocalTally()
        """Requests in flight, overall and per key: with several workers, shared by them."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        # Without API keys every request is anonymous: the overall bound is the only one.
        key = api_key_id(scope)
        lifecycle, tally = self.lifecycle, self.tally
        if lifecycle.draining:
            await _refuse(send, ShuttingDownError(headers={"retry-after": RETRY_AFTER_S}), scope)
            return
        if not tally.take(_ALL, 1, self.max_in_flight)[0]:
            await _refuse(send, OverloadedError(headers={"retry-after": RETRY_AFTER_S}), scope)
            return
        per_key = None if key == ANONYMOUS or self.max_per_key is None else _KEY + key
        if per_key is not None and not tally.take(per_key, 1, self.max_per_key)[0]:
            tally.give_back(_ALL, 1)
            await _refuse(
                send, ConcurrencyLimitError(headers={"retry-after": RETRY_AFTER_S}), scope
            )
            return
        # The process's own count: what its drain waits for.
        lifecycle.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            lifecycle.in_flight -= 1
            tally.give_back(_ALL, 1)
            if per_key is not None:
                tally.give_back(per_key, 1)


async def _refuse(send: Send, error: GatewayError, scope: Scope, reason: str | None = None) -> None:
    ADMISSION_REFUSED.labels(reason or error.code).inc()
    await send_error(send, error, scope)
