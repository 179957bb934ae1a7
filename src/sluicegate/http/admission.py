"""Admission control: a bound on inference requests in flight, overall and per API key.

A slot is taken once the request's body has arrived (`http.body_limits` reads it first), so
a slow upload holds none. A request over the bound is refused at once: 503 `overloaded` when
the gateway is full, 503 `shutting_down` while it drains after SIGTERM, and 429
`concurrency_limit_exceeded` when one key holds its share. All carry `Retry-After`.
A slot is held until the response (or stream) has been sent, so the
count covers everything the engine is running or queueing for us.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import (
    ConcurrencyLimitError,
    GatewayError,
    OverloadedError,
    ShuttingDownError,
)
from sluicegate.http.asgi import api_key_id
from sluicegate.http.errors import send_error
from sluicegate.keys import ANONYMOUS
from sluicegate.lifecycle import Lifecycle
from sluicegate.observability.metrics import ADMISSION_REFUSED
from sluicegate.paths import INFERENCE_PATHS

RETRY_AFTER_S = "1"


class AdmissionMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        lifecycle: Lifecycle,
        max_in_flight: int,
        max_in_flight_per_key: int | None,
    ):
        self.app = app
        self.lifecycle = lifecycle
        self.max_in_flight = max_in_flight
        self.max_per_key = max_in_flight_per_key
        self.per_key: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        # Without API keys every request is anonymous: the overall bound is the only one.
        key = api_key_id(scope)
        lifecycle = self.lifecycle
        if lifecycle.draining:
            await _refuse(send, ShuttingDownError(headers={"retry-after": RETRY_AFTER_S}))
            return
        if lifecycle.in_flight >= self.max_in_flight:
            await _refuse(send, OverloadedError(headers={"retry-after": RETRY_AFTER_S}))
            return
        per_key_limit = None if key == ANONYMOUS else self.max_per_key
        if per_key_limit is not None:
            if self.per_key.get(key, 0) >= per_key_limit:
                await _refuse(send, ConcurrencyLimitError(headers={"retry-after": RETRY_AFTER_S}))
                return
            self.per_key[key] = self.per_key.get(key, 0) + 1
        lifecycle.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            lifecycle.in_flight -= 1
            if per_key_limit is not None and key in self.per_key:
                self.per_key[key] -= 1
                if not self.per_key[key]:
                    del self.per_key[key]


async def _refuse(send: Send, error: GatewayError) -> None:
    ADMISSION_REFUSED.labels(error.code).inc()
    await send_error(send, error)
