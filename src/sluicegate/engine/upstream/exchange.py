"""One try of a request on one upstream: what it holds, why it failed, and how it ends.

`Exchange` is a try from its send to the end of its answer; a try that fails before any
output raises `TryFailed` with its `Failure` (the dispatcher retries it or gives up); `end`
settles a try however it ended. The labelled metric children the tries count with are
looked up here, once.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import httpx
from prometheus_client import Counter, Gauge, Histogram

from sluicegate.engine.protocol import EngineStep
from sluicegate.engine.upstream.breaker import Ticket
from sluicegate.engine.upstream.server import Upstream
from sluicegate.engine.upstream.wire import StreamReader
from sluicegate.errors import GatewayError
from sluicegate.observability import metrics


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a try failed before any output; `error` is what the client gets if it is the last."""

    outcome: str
    error: GatewayError
    retryable: bool
    wait: float | None = None
    """The upstream's Retry-After, in seconds."""
    elsewhere: bool = False
    """Retried only on an upstream not tried yet."""


@dataclass(slots=True)
class Exchange:
    """One try of a request on one upstream."""

    upstream: Upstream
    ticket: Ticket
    """What the upstream's breaker let this try through with."""
    reader: StreamReader
    listed: bool = True
    """Whether the upstream lists the model asked for (an adapter may be sent to one that
    does not, past the load bound of those that do)."""
    response: httpx.Response | None = None
    events: AsyncGenerator[EngineStep, None] | None = None


class TryFailed(Exception):
    """A try failed before any output, for the dispatcher to retry or give up on."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


async def end(exchange: Exchange) -> None:
    """The try is over: no longer in flight, its events and its response closed."""
    upstream = exchange.upstream
    upstream.in_flight -= 1
    in_flight(upstream.label).dec()
    if exchange.events is not None:
        await exchange.events.aclose()
    if exchange.response is not None:
        # Unread: the connection is closed, which aborts the request upstream.
        await exchange.response.aclose()


# Labelled children, looked up once: `labels()` costs more than the increment. Labels come
# from the configured upstreams and a fixed set of outcomes, so the caches are bounded.
@functools.cache
def _requests(label: str, outcome: str) -> Counter:
    return metrics.UPSTREAM_REQUESTS.labels(label, outcome)


@functools.cache
def in_flight(label: str) -> Gauge:
    return metrics.UPSTREAM_IN_FLIGHT.labels(label)


@functools.cache
def first_byte(label: str) -> Histogram:
    return metrics.UPSTREAM_FIRST_BYTE_SECONDS.labels(label)


def count(label: str, outcome: str) -> None:
    _requests(label, outcome).inc()
