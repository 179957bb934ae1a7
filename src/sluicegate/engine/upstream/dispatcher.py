"""Requests out: a completion or an embedding sent to an upstream, and retried before output.

A request goes to the upstream the balancer picks. Until its first output event has been
passed on, a failure (connect error, reset, 429, 502, 503, 504) is retried after a backoff
with full jitter, on another upstream when there is one, within the retry budget;
`Retry-After` keeps the upstream out of the pick for that long (at most `retry_after_max`; a
503's until a good health probe). A stall (the read or write timeout, before the headers or
after them) is retried too, but only on another upstream: the same one would most likely
keep the request waiting as long again. After the first output, the stream's own reading
(`stream.rest`) takes over, and a failure is no longer retried.

What the client is told never names an upstream (its label goes to logs and metrics), and an
upstream's refusal of the gateway's own credentials (401, 403) is the gateway's failure, a 502,
not the client's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from sluicegate import fast_json
from sluicegate.engine.protocol import EngineStep, Prompt
from sluicegate.engine.upstream.balancer import Balancer
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.exchange import (
    Exchange,
    Failure,
    TryFailed,
    count,
    end,
    first_byte,
    in_flight,
)
from sluicegate.engine.upstream.retry import RETRY_STATUSES, RetryBudget, backoff, retry_after
from sluicegate.engine.upstream.server import Upstream
from sluicegate.engine.upstream.stream import events
from sluicegate.engine.upstream.wire import StreamReader, UpstreamStreamError, error_fields
from sluicegate.errors import (
    BadGatewayError,
    DeadlineExceededError,
    EngineUnavailableError,
    GatewayError,
    RateLimitError,
    error_for_status,
)
from sluicegate.observability import metrics

logger = logging.getLogger(__name__)

_ERROR_BODY_BYTES = 64 * 1024
_CREDENTIALS_REFUSED = frozenset({401, 403, 407})
_PASSED_ON = frozenset({400, 404, 413, 422})
"""Refusals of the request itself, passed on with their status (others are a 502)."""


class Dispatcher:
    """Sends requests to a pool's upstreams: the pick, the tries, and the retries between."""

    def __init__(
        self,
        config: UpstreamConfig,
        upstreams: Sequence[Upstream],
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._upstreams = list(upstreams)
        self._balancer = Balancer(self._upstreams, config.affinity, rng)
        self._budget = RetryBudget(config.retry)
        self._rng = rng or random.Random()

    async def open(
        self,
        prompt: Prompt,
        path: str,
        content: bytes,
        reader: Callable[[], StreamReader],
        adapter: str | None,
        listing: frozenset[int] | None,
    ) -> tuple[Exchange, EngineStep, int]:
        """Send a streamed request (to the upstreams of `listing` first, for an adapter) and
        read up to its first step, retried until one try gets there: that try, its first
        step, and how many retries it took. Each try reads with a new `reader()`."""
        self._budget.deposit()
        tried: set[int] = set()
        attempt = 0
        last: Failure | None = None
        while True:
            index = self._balancer.pick(affinity_key(prompt), tried, listing)
            if index is None:
                # The try that failed last says why better than this would: its breaker
                # may have opened, or its Retry-After taken it out, with nothing else left.
                raise self._refusal(last)
            tried.add(index)
            upstream = self._upstreams[index]
            ticket = upstream.breaker.acquire()
            if ticket is None:  # its half-open trial is taken
                if len(tried) == len(self._upstreams):
                    raise self._refusal(last)
                continue
            listed = adapter is None or adapter in upstream.models
            exchange = Exchange(upstream, ticket, reader(), listed)
            try:
                first = await self._open(exchange, path, content)
            except TryFailed as failed:
                await end(exchange)
                last = failed.failure
                delay = self._retry_delay(exchange.upstream, failed.failure, attempt, tried)
                if delay is None:
                    raise failed.failure.error from None
                metrics.UPSTREAM_RETRIES.labels(
                    exchange.upstream.label, failed.failure.outcome
                ).inc()
                attempt += 1
                await asyncio.sleep(delay)
                continue
            except BaseException as exc:
                upstream.breaker.release(ticket)
                if isinstance(exc, asyncio.CancelledError):
                    count(exchange.upstream.label, "cancelled")
                await end(exchange)
                raise
            return exchange, first, attempt

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` (under /v1) on an upstream the balancer picks, with the
        pool's retries, breakers and error mapping, and its JSON answer."""
        content = fast_json.dumps(body)
        self._budget.deposit()
        tried: set[int] = set()
        attempt = 0
        last: Failure | None = None
        while True:
            index = self._balancer.pick(None, tried)
            if index is None:
                raise self._refusal(last)
            tried.add(index)
            upstream = self._upstreams[index]
            ticket = upstream.breaker.acquire()
            if ticket is None:
                if len(tried) == len(self._upstreams):
                    raise self._refusal(last)
                continue
            exchange = Exchange(upstream, ticket, StreamReader(choices=1))
            try:
                return await self._json_try(exchange, path, content)
            except TryFailed as failed:
                last = failed.failure
                delay = self._retry_delay(upstream, failed.failure, attempt, tried)
                if delay is None:
                    raise failed.failure.error from None
                metrics.UPSTREAM_RETRIES.labels(upstream.label, failed.failure.outcome).inc()
                attempt += 1
                await asyncio.sleep(delay)

    # ---- one try ----------------------------------------------------------------------------

    async def _json_try(self, exchange: Exchange, path: str, content: bytes) -> dict[str, Any]:
        upstream = exchange.upstream
        upstream.in_flight += 1
        in_flight(upstream.label).inc()
        sent = time.perf_counter()
        outcome = "cancelled"
        try:
            try:
                response = await self._send(exchange, path, content)
            except (TryFailed, GatewayError):
                outcome = "failed"
                raise
            try:
                raw = await response.aread()
                answer = json.loads(raw)
            except httpx.TimeoutException as exc:
                outcome = "failed"
                raise self._stalled(exchange) from exc
            except (httpx.TransportError, ValueError) as exc:
                error: GatewayError = BadGatewayError(
                    f"The upstream server failed while answering: {exc}"
                )
                outcome = "failed"
                raise self._failed(exchange, "stream_error", error, True, detail=exc) from exc
            if not isinstance(answer, dict):
                outcome = "failed"
                error = BadGatewayError("The upstream answered something that is not an object.")
                raise self._failed(exchange, "stream_error", error, False)
            first_byte(upstream.label).observe(time.perf_counter() - sent)
            outcome = "ok"
            upstream.breaker.success(exchange.ticket)
            count(upstream.label, "ok")
            return answer
        finally:
            if outcome == "cancelled":
                upstream.breaker.release(exchange.ticket)
                count(upstream.label, "cancelled")
            await end(exchange)

    async def _open(self, exchange: Exchange, path: str, content: bytes) -> EngineStep:
        """Send the request and read up to its first step; `TryFailed` if it fails first."""
        upstream = exchange.upstream
        label = upstream.label
        upstream.in_flight += 1
        in_flight(label).inc()
        sent = time.perf_counter()
        response = await self._send(exchange, path, content)
        exchange.events = events(exchange.reader, response, upstream.reads_whole)
        try:
            first = await anext(exchange.events)
        except StopAsyncIteration:
            first = exchange.reader.finish()  # a stream without output
        except httpx.TimeoutException as exc:
            raise self._stalled(exchange) from exc
        except (httpx.TransportError, UpstreamStreamError, ValueError) as exc:
            reset = isinstance(exc, httpx.TransportError)
            error = BadGatewayError(f"The upstream server failed before answering: {exc}")
            raise self._failed(
                exchange, "reset" if reset else "stream_error", error, reset, detail=exc
            ) from exc
        first_byte(label).observe(time.perf_counter() - sent)
        return first

    async def _send(self, exchange: Exchange, path: str, content: bytes) -> httpx.Response:
        """Send the request and take the answer's status: `TryFailed` if it could not be
        sent or the upstream refused it in a way to try again, its error if to pass on."""
        upstream = exchange.upstream
        try:
            # No X-Request-Id: llama.cpp's server refuses one that is not a UUID (400, no body).
            exchange.response = await upstream.send(path, content)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            error: GatewayError = BadGatewayError("Could not connect to the upstream server.")
            raise self._failed(exchange, "connect_error", error, True, detail=exc) from exc
        except httpx.TimeoutException as exc:
            raise self._stalled(exchange) from exc
        except httpx.TransportError as exc:
            error = BadGatewayError("The upstream server closed the connection.")
            raise self._failed(exchange, "reset", error, True, detail=exc) from exc
        if exchange.response.status_code != 200:
            await self._refused(exchange, exchange.response)
        return exchange.response

    async def _refused(self, exchange: Exchange, response: httpx.Response) -> None:
        """A non-200 answer: a failure to retry, or the upstream's refusal to pass on."""
        upstream = exchange.upstream
        status = response.status_code
        raw = b""
        async for chunk in response.aiter_bytes():
            raw += chunk
            if len(raw) > _ERROR_BODY_BYTES:
                break
        message, param, code = error_fields(raw)
        wait = retry_after(response.headers.get("retry-after"), self._config.retry.retry_after_max)
        label = upstream.label
        if status in RETRY_STATUSES:
            headers = {} if wait is None else {"retry-after": str(max(1, round(wait)))}
            error: GatewayError
            if status == 429:
                error = RateLimitError(message or "The upstream is rate limiting.", headers=headers)
            elif status == 503:
                error = EngineUnavailableError(
                    message or "The upstream server is unavailable.", headers=headers
                )
            else:
                error = BadGatewayError(message or f"The upstream server answered {status}.")
            outcome = "rate_limited" if status == 429 else "server_error"
            raise self._failed(exchange, outcome, error, retryable=True, wait=wait)
        if status >= 500:
            error = BadGatewayError(message or f"The upstream server answered {status}.")
            raise self._failed(exchange, "server_error", error, retryable=False)
        if status in _CREDENTIALS_REFUSED:
            # The gateway's credentials (UPSTREAM_API_KEY), not the client's: the client's
            # key was taken already, and the upstream's words about ours are for the operator.
            logger.warning(
                "upstream %s refused the gateway's credentials (%d): %s", label, status, message
            )
            error = BadGatewayError("The upstream server refused the gateway's credentials.")
            raise self._failed(exchange, "auth_error", error, retryable=False)
        # The upstream works and refused the request: its words, its status.
        upstream.breaker.success(exchange.ticket)
        count(label, "client_error")
        if status == 404 and not exchange.listed:
            # An adapter it does not have: one that lists it can take the request.
            error = error_for_status(404, message or "The upstream does not serve this model.")
            raise TryFailed(Failure("client_error", error, retryable=True, elsewhere=True))
        if status not in _PASSED_ON:
            logger.info("upstream %s answered %d: %s", label, status, message)
            raise BadGatewayError(f"The upstream server refused the request ({status}).")
        refusal = error_for_status(status, message or f"The upstream answered {status}.")
        refusal.param, refusal.code = param, code or refusal.code
        raise refusal

    def _stalled(self, exchange: Exchange) -> TryFailed:
        """The upstream sent (or took) nothing within its read (or write) timeout, before any
        output: whether or not its headers came, the same failure, `timeout`. Tried again on
        another upstream, within the request's own deadline (`request_timeout`)."""
        error = DeadlineExceededError("The upstream server did not answer in time.")
        return self._failed(exchange, "timeout", error, retryable=True, elsewhere=True)

    def _failed(
        self,
        exchange: Exchange,
        outcome: str,
        error: GatewayError,
        retryable: bool,
        wait: float | None = None,
        elsewhere: bool = False,
        detail: Exception | None = None,
    ) -> TryFailed:
        """A failed try, counted; the upstream's label goes to the log, never to the client."""
        upstream = exchange.upstream
        rate_limited = outcome == "rate_limited"
        if rate_limited:
            upstream.breaker.release(exchange.ticket)  # busy, not broken
        else:
            upstream.breaker.failure(exchange.ticket)
        count(upstream.label, outcome)
        logger.info("upstream %s: %s (%s)", upstream.label, error.message, detail or outcome)
        if wait is not None:
            upstream.hold_off(wait, rate_limited)
        return TryFailed(Failure(outcome, error, retryable, wait, elsewhere))

    # ---- between tries ----------------------------------------------------------------------

    def _refusal(self, last: Failure | None) -> GatewayError:
        """What a request gets when no upstream can take it (`Balancer.refusal`)."""
        error = None if last is None else last.error
        return self._balancer.refusal(error, self._config.health_interval)

    def _retry_delay(
        self, upstream: Upstream, failure: Failure, attempt: int, tried: set[int]
    ) -> float | None:
        """How long to wait before the next try, or None to give up."""
        config = self._config.retry
        if not failure.retryable or attempt >= config.max_retries:
            return None
        others = self._balancer.pick(None, tried)
        if others is None and failure.wait is None:
            return None  # nothing to try on: not even after a wait it asked for
        alone = others is None or others in tried  # no upstream left that was not tried
        if alone and failure.elsewhere:
            return None
        # Only the upstream that asked us to wait is left: wait as asked, if not too long.
        wait = failure.wait if alone else None
        if wait is not None and wait > config.backoff_max:
            return None
        if not self._budget.withdraw():
            metrics.UPSTREAM_RETRIES_DENIED.inc()
            return None
        delay = backoff(config, attempt, self._rng)
        if wait is not None:
            delay = max(delay, wait)
            upstream.not_before = 0.0
        return delay


def affinity_key(prompt: Prompt) -> str:
    """The prompt's start, as the upstream sees it (for prefix affinity)."""
    if prompt.chat is not None:
        return "".join(
            f"{m.get('role')}\x00{m.get('content') or ''}\x00" for m in prompt.chat.messages[:4]
        )
    if prompt.text is not None:
        return prompt.text
    return ",".join(str(i) for i in prompt.ids[:256])
