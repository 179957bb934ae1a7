"""`UpstreamEngine`: the engine protocol over remote OpenAI-compatible servers.

A request goes to the upstream the balancer picks, streamed. Until its first output event
has been passed on, a failure (connect error, reset, 429, 502, 503, 504) is retried after a
backoff with full jitter, on another upstream when there is one, within the retry budget;
`Retry-After` keeps the upstream out of the pick for that long (at most `retry_after_max`; a
503's until a good health probe). A stall (the read or write
timeout, before the headers or after them) is retried too, but only on another upstream:
the same one would most likely keep the request waiting as long again. Once output has been passed
on, a failure ends the response with an error (the stream layer sends an error event, then
`[DONE]`): a retry would repeat or contradict what the client already has. Closing the step
iterator (the client left) closes the upstream response, and with it the connection, at once.

What the client is told never names an upstream (its label goes to logs and metrics), and an
upstream's refusal of the gateway's own credentials (401, 403) is the gateway's failure, a 502,
not the client's.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
from prometheus_client import Counter, Gauge, Histogram

from sluicegate import fast_json
from sluicegate.engine.protocol import (
    Embedding,
    EngineLoad,
    EngineStep,
    Prompt,
    PromptTokenizer,
    SamplingOptions,
    StructuredOutput,
    ToolCallParser,
)
from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.engine.upstream.balancer import Balancer
from sluicegate.engine.upstream.breaker import STATE_VALUES, BreakerState, Ticket
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.discovery import (
    HEALTH_TIMEOUT,
    UpstreamStartError,
    discover,
    listing_of,
    refresh_listing,
)
from sluicegate.engine.upstream.reads import coalesced
from sluicegate.engine.upstream.retry import RETRY_STATUSES, RetryBudget, backoff, retry_after
from sluicegate.engine.upstream.server import Upstream
from sluicegate.engine.upstream.tokenizer import RemoteTokenizer
from sluicegate.engine.upstream.tool_calls import UpstreamToolParser, reads_records
from sluicegate.engine.upstream.wire import (
    StreamReader,
    UpstreamStreamError,
    error_fields,
    request_body,
    token_count,
)
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


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why a try failed before any output; `error` is what the client gets if it is the last."""

    outcome: str
    error: GatewayError
    retryable: bool
    wait: float | None = None
    """The upstream's Retry-After, in seconds."""
    elsewhere: bool = False
    """Retried only on an upstream not tried yet."""


class UpstreamEngine:
    def __init__(
        self,
        config: UpstreamConfig,
        upstreams: Sequence[Upstream],
        model: str,
        max_model_len: int,
        tokenizer: PromptTokenizer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._upstreams = list(upstreams)
        self._balancer = Balancer(self._upstreams, config.affinity, rng)
        self._budget = RetryBudget(config.retry)
        self._rng = rng or random.Random()
        self._tokenizer = tokenizer
        self._parser = UpstreamToolParser()
        self.model = model
        """The model id the upstreams serve (their `/v1/models`)."""
        self._max_model_len = max_model_len
        self._health: asyncio.Task[None] | None = None
        for upstream in self._upstreams:
            label = upstream.label
            for outcome in metrics.UPSTREAM_OUTCOMES:
                metrics.UPSTREAM_REQUESTS.labels(label, outcome)
            for reason in metrics.UPSTREAM_RETRY_REASONS:
                metrics.UPSTREAM_RETRIES.labels(label, reason)
            metrics.UPSTREAM_HEALTHY.labels(label).set(1)
            metrics.UPSTREAM_IN_FLIGHT.labels(label).set(0)
            breaker_gauge = metrics.UPSTREAM_BREAKER_STATE.labels(label)
            breaker_gauge.set(upstream.breaker.value())
            upstream.breaker.on_change = functools.partial(_show_breaker, breaker_gauge)

    @classmethod
    async def start(
        cls,
        config: UpstreamConfig,
        wait: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> UpstreamEngine:
        """Open a pool per upstream, learn the model from the first `/v1/models` that answers
        (within `wait` seconds, by default `config.start_timeout`), find a tokenizer, and start
        the health probes."""
        wait = config.start_timeout if wait is None else wait
        upstreams = [
            Upstream(url, weight, config.pool, config.breaker, config.api_key, transport)
            for url, weight in config.urls
        ]
        try:
            found, card = await discover(upstreams, wait, config.model)
            model = str(card["id"])
            max_model_len = int(card.get("max_model_len") or config.max_model_len)
            tokenizer = await _tokenizer(config, found, model)
        except BaseException:
            for upstream in upstreams:
                await upstream.close()
            raise
        engine = cls(config, upstreams, model, max_model_len, tokenizer)
        engine.watch_health()
        return engine

    # ---- the protocol -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        return self._tokenizer

    @property
    def tool_parser(self) -> ToolCallParser:
        return self._parser

    @property
    def renders_chat(self) -> bool:
        return True

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def upstreams(self) -> list[Upstream]:
        return self._upstreams

    def listed_adapters(self) -> list[str]:
        """The adapters of this pool's model its upstreams list (vLLM's servers list each
        with `parent` set to its base model), as of the last probes."""
        names: dict[str, None] = {}
        for upstream in self._upstreams:
            for name, parent in upstream.models.items():
                if parent == self.model and name != self.model:
                    names[name] = None
        return list(names)

    def _listing(self, adapter: str | None) -> frozenset[int] | None:
        """For an adapter: the upstreams that list it, which the balancer prefers."""
        if adapter is None:
            return None
        return frozenset(i for i, u in enumerate(self._upstreams) if adapter in u.models)

    async def generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        # `priority` is this gateway's own queue order (its keys' ranks and shares), not sent:
        # an upstream orders its own queue, and vLLM's server refuses any priority but 0
        # unless it schedules by priority (docs/upstream.md).
        model = adapter or self.model
        path, body = request_body(model, prompt, options, options.max_tokens_given)
        content = fast_json.dumps(body)
        self._budget.deposit()
        tried: set[int] = set()
        attempt = 0
        last: _Failure | None = None
        records = reads_records(prompt.chat)
        # Passed through: one choice (`StreamReader._feed_raw` reads choice 0) without tools.
        raw = self._config.pass_through and options.pass_through and options.n == 1 and not records
        listing = self._listing(adapter)
        while True:
            index = self._balancer.pick(_affinity_key(prompt), tried, listing)
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
            reader = StreamReader(options.n, records, raw, window=self._max_model_len)
            listed = adapter is None or adapter in upstream.models
            exchange = _Exchange(upstream, ticket, reader, listed)
            try:
                first = await self._open(exchange, path, content)
            except _TryFailed as failed:
                await self._end(exchange)
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
                    _count(exchange.upstream.label, "cancelled")
                await self._end(exchange)
                raise
            # Output has begun: from here on, what fails ends the response.
            async with contextlib.aclosing(self._rest(exchange, first)) as steps:
                async for step in steps:
                    if attempt:
                        step.retried = True
                    yield step
            return

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        """The upstreams' `/v1/embeddings` for every prompt in one request (token ids where
        the pool has a tokenizer, else the texts), with the pool's retries and breakers. Each
        input's tokens: its ids, or without ids its share of the upstream's count by
        length."""
        texts = [p.text or "" for p in prompts]
        body: dict[str, Any] = {
            "model": self.model,
            "input": [p.ids if p.ids else p.text or "" for p in prompts],
            "encoding_format": "float",
        }
        if dimensions is not None:
            body["dimensions"] = dimensions
        answer = await self.post_json("/embeddings", body)
        try:
            data = sorted(answer["data"], key=lambda item: int(item["index"]))
            vectors = [[float(x) for x in item["embedding"]] for item in data]
            reported = (answer.get("usage") or {}).get("prompt_tokens")
            total = token_count(reported, self._max_model_len * len(prompts)) or 0
        except (KeyError, TypeError, ValueError) as exc:
            raise BadGatewayError("The upstream answered embeddings in another shape.") from exc
        if len(vectors) != len(prompts):
            raise BadGatewayError(
                f"The upstream answered {len(vectors)} embeddings for {len(prompts)} inputs."
            )
        counts = [p.length for p in prompts]
        if not all(counts):
            length = sum(len(t) for t in texts) or 1
            counts = [
                p.length or round(total * len(t) / length)
                for p, t in zip(prompts, texts, strict=True)
            ]
        return [Embedding(v, c) for v, c in zip(vectors, counts, strict=True)]

    async def check_dimensions(self, dimensions: int) -> None:
        """The upstream checks `dimensions` itself; its refusal is a 400 from it."""

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` (under /v1) on an upstream the balancer picks, with the
        pool's retries, breakers and error mapping, and its JSON answer."""
        content = fast_json.dumps(body)
        self._budget.deposit()
        tried: set[int] = set()
        attempt = 0
        last: _Failure | None = None
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
            exchange = _Exchange(upstream, ticket, StreamReader(choices=1))
            try:
                return await self._json_try(exchange, path, content)
            except _TryFailed as failed:
                last = failed.failure
                delay = self._retry_delay(upstream, failed.failure, attempt, tried)
                if delay is None:
                    raise failed.failure.error from None
                metrics.UPSTREAM_RETRIES.labels(upstream.label, failed.failure.outcome).inc()
                attempt += 1
                await asyncio.sleep(delay)

    async def _json_try(self, exchange: _Exchange, path: str, content: bytes) -> dict[str, Any]:
        upstream = exchange.upstream
        upstream.in_flight += 1
        _in_flight(upstream.label).inc()
        sent = time.perf_counter()
        outcome = "cancelled"
        try:
            try:
                response = await self._send(exchange, path, content)
            except (_TryFailed, GatewayError):
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
            _first_byte(upstream.label).observe(time.perf_counter() - sent)
            outcome = "ok"
            upstream.breaker.success(exchange.ticket)
            _count(upstream.label, "ok")
            return answer
        finally:
            if outcome == "cancelled":
                upstream.breaker.release(exchange.ticket)
                _count(upstream.label, "cancelled")
            await self._end(exchange)

    async def check_structured(self, structured: StructuredOutput) -> None:
        """The upstream checks its constraints itself; its refusal is a 400 from it."""

    def load(self) -> EngineLoad | None:
        """Not known: an upstream's scheduler is its own (and may serve others too)."""
        return None

    async def check_health(self) -> None:
        if not any(u.healthy for u in self._upstreams):
            raise EngineUnavailableError("No upstream is healthy.")

    async def shutdown(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        for upstream in self._upstreams:
            await upstream.close()

    # ---- one try ----------------------------------------------------------------------------

    async def _open(self, exchange: _Exchange, path: str, content: bytes) -> EngineStep:
        """Send the request and read up to its first step; `_TryFailed` if it fails first."""
        upstream = exchange.upstream
        label = upstream.label
        upstream.in_flight += 1
        _in_flight(label).inc()
        sent = time.perf_counter()
        response = await self._send(exchange, path, content)
        exchange.events = self._events(exchange.reader, response, upstream.reads_whole)
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
        _first_byte(label).observe(time.perf_counter() - sent)
        return first

    async def _send(self, exchange: _Exchange, path: str, content: bytes) -> httpx.Response:
        """Send the request and take the answer's status: `_TryFailed` if it could not be
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

    async def _rest(
        self, exchange: _Exchange, first: EngineStep
    ) -> AsyncGenerator[EngineStep, None]:
        """The first step, then the rest; the exchange is ended however this ends."""
        upstream, reader, ticket = exchange.upstream, exchange.reader, exchange.ticket
        outcome = "cancelled"
        try:
            yield first
            if first.finished:
                outcome = "ok"
                upstream.breaker.success(ticket)
                return
            assert exchange.events is not None
            async for step in exchange.events:
                yield step
            if not reader.done and reader.usage is None:
                raise UpstreamStreamError({"message": "the stream ended before [DONE]"})
            outcome = "ok"
            upstream.breaker.success(ticket)
            yield reader.finish()
        except (httpx.TransportError, UpstreamStreamError, ValueError) as exc:
            outcome = "stream_error"
            upstream.breaker.failure(ticket)
            logger.info("upstream %s failed while answering: %r", upstream.label, exc)
            raise BadGatewayError(
                f"The upstream server failed while answering: {exc}",
                code="upstream_stream_error",
            ) from exc
        finally:
            if outcome == "cancelled":
                upstream.breaker.release(ticket)
            _count(upstream.label, outcome)
            await self._end(exchange)

    async def _events(
        self, reader: StreamReader, response: httpx.Response, reads_whole: bool
    ) -> AsyncGenerator[EngineStep, None]:
        """One step for all the events that came since the last: an upstream faster than
        the gateway costs one pass down the pipeline per read, not one per event. A transport
        that hands out a chunk at a time is read ahead (`reads.coalesced`); one that hands out
        all it holds (`Upstream.reads_whole`) needs no task for it. Read to the body's end,
        past `[DONE]`: a response closed before its last chunk closes its connection too, and
        the next request would pay for a new one."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial = ""
        # An async generator (httpx types it as an iterator): closing it ends the read.
        body = cast(AsyncGenerator[bytes, None], response.aiter_bytes())
        async with contextlib.aclosing(body if reads_whole else coalesced(body)) as pieces:
            async for piece in pieces:
                lines = (partial + decoder.decode(piece)).split("\n")
                partial = lines.pop()
                step = reader.feed_lines(lines)
                if step is not None:
                    yield step
        step = reader.feed_lines([partial + decoder.decode(b"", final=True)])
        if step is not None:
            yield step

    async def _end(self, exchange: _Exchange) -> None:
        upstream = exchange.upstream
        upstream.in_flight -= 1
        _in_flight(upstream.label).dec()
        if exchange.events is not None:
            await exchange.events.aclose()
        if exchange.response is not None:
            # Unread: the connection is closed, which aborts the request upstream.
            await exchange.response.aclose()

    async def _refused(self, exchange: _Exchange, response: httpx.Response) -> None:
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
        _count(label, "client_error")
        if status == 404 and not exchange.listed:
            # An adapter it does not have: one that lists it can take the request.
            error = error_for_status(404, message or "The upstream does not serve this model.")
            raise _TryFailed(_Failure("client_error", error, retryable=True, elsewhere=True))
        if status not in _PASSED_ON:
            logger.info("upstream %s answered %d: %s", label, status, message)
            raise BadGatewayError(f"The upstream server refused the request ({status}).")
        refusal = error_for_status(status, message or f"The upstream answered {status}.")
        refusal.param, refusal.code = param, code or refusal.code
        raise refusal

    def _stalled(self, exchange: _Exchange) -> _TryFailed:
        """The upstream sent (or took) nothing within its read (or write) timeout, before any
        output: whether or not its headers came, the same failure, `timeout`. Tried again on
        another upstream, within the request's own deadline (`request_timeout`)."""
        error = DeadlineExceededError("The upstream server did not answer in time.")
        return self._failed(exchange, "timeout", error, retryable=True, elsewhere=True)

    def _failed(
        self,
        exchange: _Exchange,
        outcome: str,
        error: GatewayError,
        retryable: bool,
        wait: float | None = None,
        elsewhere: bool = False,
        detail: Exception | None = None,
    ) -> _TryFailed:
        """A failed try, counted; the upstream's label goes to the log, never to the client."""
        upstream = exchange.upstream
        rate_limited = outcome == "rate_limited"
        if rate_limited:
            upstream.breaker.release(exchange.ticket)  # busy, not broken
        else:
            upstream.breaker.failure(exchange.ticket)
        _count(upstream.label, outcome)
        logger.info("upstream %s: %s (%s)", upstream.label, error.message, detail or outcome)
        if wait is not None:
            upstream.hold_off(wait, rate_limited)
        return _TryFailed(_Failure(outcome, error, retryable, wait, elsewhere))

    def _refusal(self, last: _Failure | None) -> GatewayError:
        """What a request gets when no upstream can take it (`Balancer.refusal`)."""
        error = None if last is None else last.error
        return self._balancer.refusal(error, self._config.health_interval)

    def _retry_delay(
        self, upstream: Upstream, failure: _Failure, attempt: int, tried: set[int]
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

    # ---- health -----------------------------------------------------------------------------

    def watch_health(self) -> None:
        """Probe every upstream every `health_interval` seconds, until shutdown."""
        self._health = asyncio.create_task(self._probe_forever(), name="upstream-health")

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(u) for u in self._upstreams))
            await asyncio.sleep(self._config.health_interval)

    async def _probe(self, upstream: Upstream) -> None:
        sent = time.monotonic()
        timeout = min(HEALTH_TIMEOUT, self._config.health_interval)
        lists_models = self._config.health_path.rstrip("/") == "/v1/models"
        try:
            response = await upstream.client.get(
                upstream.origin() + self._config.health_path, timeout=timeout
            )
            answered = response.status_code == 200
            if answered and lists_models:
                upstream.models = listing_of(response)
        except httpx.HTTPError:
            answered = False
        if answered and not lists_models:
            await refresh_listing(upstream, timeout)
        upstream.failed_probes = 0 if answered else upstream.failed_probes + 1
        if answered:
            upstream.probe_answered(sent)
        healthy = answered or (
            upstream.healthy and upstream.failed_probes < self._config.health_failures
        )
        if healthy != upstream.healthy:
            log = logger.info if healthy else logger.warning
            log("upstream %s is %s", upstream.label, "healthy" if healthy else "unhealthy")
        upstream.healthy = healthy
        metrics.UPSTREAM_HEALTHY.labels(upstream.label).set(int(healthy))
        # An open breaker turns half-open as time passes: looked at here, its gauge says so
        # within a probe interval even while no request asks (see `Breaker.on_change`).
        _ = upstream.breaker.state


@dataclass(slots=True)
class _Exchange:
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


class _TryFailed(Exception):
    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


async def _tokenizer(
    config: UpstreamConfig, upstream: Upstream, model: str
) -> PromptTokenizer | None:
    """The configured local tokenizer, else the upstream's `/tokenize`, else none."""
    if config.tokenizer is not None:
        return await asyncio.to_thread(_local_tokenizer, config.tokenizer)
    remote = RemoteTokenizer(upstream.client, upstream.origin(), model)
    try:
        await remote.probe()
    except GatewayError as exc:
        logger.warning(
            "upstream %s has no usable /tokenize (%s) and SLUICEGATE_TOKENIZER is not set: "
            "the token budget is off for %s (no prompt fitting or max_tokens clamping; token "
            "counts come from the upstream's usage)",
            upstream.label,
            exc.message,
            model,
        )
        return None
    logger.info("token budget counts with the /tokenize of upstream %s", upstream.label)
    return remote


def _local_tokenizer(name: str) -> PromptTokenizer:
    """`name`'s tokenizer (a folder, or a hub id fetched when the hub is reachable), with
    transformers alone: upstream mode installs no vLLM (the `tokenizer` extra)."""
    from transformers import AutoTokenizer

    folder = Path(name).expanduser()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder) if folder.exists() else name)
        return HFPromptTokenizer(tokenizer)
    except (OSError, ValueError) as exc:
        raise UpstreamStartError(f"the tokenizer {name} cannot be loaded: {exc}") from exc


# Labelled children, looked up once: `labels()` costs more than the increment. Labels come
# from the configured upstreams and a fixed set of outcomes, so the caches are bounded.
@functools.cache
def _requests(label: str, outcome: str) -> Counter:
    return metrics.UPSTREAM_REQUESTS.labels(label, outcome)


def _show_breaker(gauge: Gauge, state: BreakerState) -> None:
    gauge.set(STATE_VALUES[state])


@functools.cache
def _in_flight(label: str) -> Gauge:
    return metrics.UPSTREAM_IN_FLIGHT.labels(label)


@functools.cache
def _first_byte(label: str) -> Histogram:
    return metrics.UPSTREAM_FIRST_BYTE_SECONDS.labels(label)


def _count(label: str, outcome: str) -> None:
    _requests(label, outcome).inc()


def _affinity_key(prompt: Prompt) -> str:
    """The prompt's start, as the upstream sees it (for prefix affinity)."""
    if prompt.chat is not None:
        return "".join(
            f"{m.get('role')}\x00{m.get('content') or ''}\x00" for m in prompt.chat.messages[:4]
        )
    if prompt.text is not None:
        return prompt.text
    return ",".join(str(i) for i in prompt.ids[:256])
