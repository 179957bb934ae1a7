"""`POST /v1/chat/completions` and `POST /v1/completions`.

Each route names its request's model; `respond` resolves it in the registry (an alias, an
adapter), prepares a `Run` on that model's service (limits, template, token budget) and hands
it to `Exchange.respond`, whose steps read top to bottom: admit (rate limits of the key and of
the model, the key's share of the engine), look up (the response cache), then answer from
the cache, or stream or collect the output: the engine's, or an identical request's in flight
(`cache.flight`). Whatever way the exchange ends, it is settled once: the completion tokens
produced are charged instead of the reservation, and the sequences come free.

A model that cannot serve the request before its first byte (its engine or upstreams
unavailable or overloaded, rate limited, or the prompt over its window) hands it to its
fallbacks, in order (`fallback_reason`); the answer's `model` names the one that answered,
and `x-sluicegate-fallback` the model first asked. Never after the first byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import StateDep, models_for
from sluicegate.api.route import LargeBodyRoute
from sluicegate.cache.response_cache import Lookup
from sluicegate.errors import (
    BadGatewayError,
    ContextLengthExceededError,
    EngineUnavailableError,
    GatewayError,
    KeyRateLimitError,
    OverloadedError,
    RateLimitError,
    ShuttingDownError,
    StoreUnavailableError,
)
from sluicegate.http.asgi import api_key_id, counted
from sluicegate.http.cache_hits import body_fingerprint, cache_control
from sluicegate.http.disconnect import until_disconnect
from sluicegate.http.sse import Keepalive, open_event_stream
from sluicegate.http.state import AppState
from sluicegate.inference.images import RequestImages
from sluicegate.inference.run import Run
from sluicegate.inference.service import DeltaSource
from sluicegate.models.served import ServedModel
from sluicegate.observability.metrics import MODEL_FALLBACKS
from sluicegate.observability.record import current_request, mark_model
from sluicegate.observability.tracing import span
from sluicegate.observability.traffic_entry import TrafficEntry
from sluicegate.quota.quotas import Reservation
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import opens_early, render_cached, stream_writer
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["completions"], route_class=LargeBodyRoute)
# Tokenizing the request and fitting it to the context window: the token budget.
TOKEN_BUDGET_SPAN = "token_budget"


FALLBACK_HEADER = "x-sluicegate-fallback"
"""On an answer a fallback gave: the model the request asked for."""


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    images = None
    if parts := body.image_parts():
        images = RequestImages(parts, state.media)
    prepare = _prepare_chat(body, images)
    return await respond(body.model, body.stream, request, state, prepare, images is not None)


@router.post("/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    return await respond(body.model, body.stream, request, state, _prepare_completion(body))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request made ready on one model: its run, and what to tell when it is answered."""

    run: Run
    answered: Callable[[], Awaitable[None]] | None = None


Prepare = Callable[[ServedModel], Awaitable[Prepared]]
"""Makes the request ready on a model (each model of a fallback chain in turn)."""


def _prepare_chat(body: ChatCompletionRequest, images: RequestImages | None = None) -> Prepare:
    async def prepare(model: ServedModel) -> Prepared:
        return Prepared(await model.service.prepare_chat(body, images))

    return prepare


def _prepare_completion(body: CompletionRequest) -> Prepare:
    async def prepare(model: ServedModel) -> Prepared:
        return Prepared(await model.service.prepare_completion(body))

    return prepare


async def respond(
    model: str,
    stream: bool,
    request: Request,
    state: AppState,
    prepare: Prepare,
    images: bool = False,
) -> Response:
    """The request answered by `model` (an alias or adapter resolved), or by its fallbacks
    in order while each fails before its first byte (with `images`, those that read them)."""
    chain = models_for(request, state).chain(model)
    asked = chain[0]
    if images:
        # A fallback that reads text only is none for a request with images (the model
        # asked for refuses them itself, saying so).
        chain = [asked, *(m for m in chain[1:] if m.engine.takes_images)]
    for position, served in enumerate(chain):
        try:
            mark_model(served.name)
            with span(TOKEN_BUDGET_SPAN):
                prepared = await prepare(served)
            exchange = Exchange.start(
                prepared.run, stream, request, state, served, answered=prepared.answered
            )
            if position:
                exchange.headers[FALLBACK_HEADER] = asked.name
            return await exchange.respond()
        except GatewayError as exc:
            reason = fallback_reason(exc)
            if reason is None or position + 1 == len(chain):
                raise
            MODEL_FALLBACKS.labels(served.name, chain[position + 1].name, reason).inc()
            logger.info(
                "model %s could not serve a request (%s: %s); trying %s",
                served.name,
                reason,
                exc.message,
                chain[position + 1].name,
            )
    raise AssertionError("unreachable: the last model's error is raised")


def fallback_reason(exc: GatewayError) -> str | None:
    """Why a model's failure before any output lets a fallback try, or None when no other
    model would do better (the request itself is wrong, the key is out of its limits, the
    gateway is stopping)."""
    if isinstance(exc, ContextLengthExceededError):
        return "context_window"
    if isinstance(exc, ShuttingDownError | StoreUnavailableError | KeyRateLimitError):
        return None
    if isinstance(exc, OverloadedError):
        return "overloaded"
    if isinstance(exc, EngineUnavailableError):
        return "unavailable"
    if isinstance(exc, RateLimitError):
        return "rate_limited"
    if isinstance(exc, BadGatewayError):
        return "upstream_error"
    return None


@dataclass(slots=True)
class Exchange:
    """One prepared inference request on its way to a response."""

    run: Run
    stream: bool
    request: Request
    state: AppState
    model: ServedModel
    key_id: str
    deadline: float
    """Event-loop time by which the whole response must be sent (`request_timeout`)."""
    headers: dict[str, str] = field(default_factory=dict)
    reservation: Reservation | None = None
    follows: bool = False
    """Whether the response comes from an identical request's run."""
    answered: Callable[[], Awaitable[None]] | None = None
    """Told when the whole response is rendered (before a stream's last events are sent);
    not when it failed."""
    traffic: TrafficEntry | None = None
    """What the traffic capture records of the request (`observability.capture`)."""

    @classmethod
    def start(
        cls,
        run: Run,
        stream: bool,
        request: Request,
        state: AppState,
        model: ServedModel,
        answered: Callable[[], Awaitable[None]] | None = None,
    ) -> Exchange:
        deadline = asyncio.get_running_loop().time() + state.timeouts.request
        key_id = api_key_id(request.scope)
        record = current_request()
        if (traffic := record.traffic if record is not None else None) is not None:
            # As the client asked, before admission makes its priority the engine's.
            traffic.shape(run, stream)
        return cls(
            run, stream, request, state, model, key_id, deadline, answered=answered, traffic=traffic
        )

    async def respond(self) -> Response:
        await self.admit()
        try:
            lookup = await self.look_up()
            if lookup.completion is not None:
                self._runs_elsewhere()
                return await self.answer_from_cache(lookup.completion)
            deltas = self.output(lookup)
            if self.follows:
                self._runs_elsewhere()
            elif self.traffic is not None:
                self.traffic.runs(lookup.outcome)
            if self.stream:
                # From here the stream settles when it ends (`service.stream`'s `on_end`).
                return await self.stream_events(deltas)
            return await self.collect(deltas)
        except BaseException:
            # Nothing was used, or the run has settled already (then this does nothing).
            await self._settle(0, 0)
            raise

    async def admit(self) -> None:
        """Reserve the request's possible cost against its key's rate limits and take its
        sequences from the key's share of the engine (429 when either is used up)."""
        run = self.run
        self.reservation = await self.state.quotas.reserve(
            self.key_id,
            run.prompt_tokens,
            sequences=run.expected_choices,
            max_tokens=run.options.max_tokens,
            param=run.sequences_param,
            priority=run.priority,
            counted=counted(self.request.scope),
            model=self.model.quota,
            estimated=run.uncounted_prompt_bound,
        )
        self.headers.update(self.reservation.headers)
        self.run = dataclasses.replace(run, priority=self.reservation.priority, key_id=self.key_id)
        if run.budget is not None:
            self.headers.update(run.budget.headers())

    async def look_up(self) -> Lookup:
        """The cached response, or the flight to lead or follow (see `cache.response_cache`)."""
        scope, receive = self.request.scope, self.request.receive
        lookup = await self.state.cache.lookup(
            self.run,
            scope["path"],
            self.key_id,
            cache_control(scope),
            # Waits for another replica's entry end when the client leaves.
            wait=lambda work: until_disconnect(receive, work, self._time_left()),
            fingerprint=body_fingerprint(scope),
            stream=self.stream,
        )
        self.headers.update(lookup.headers())
        return lookup

    async def answer_from_cache(self, completion: Completion) -> Response:
        answer = render_cached(self.run.format, completion, self.stream, self.run.include_usage)
        if (record := current_request()) is not None:
            record.add_usage(
                completion.prompt_tokens,
                completion.completion_tokens,
                cached=completion.prompt_tokens,
            )
        await self._settle(completion.completion_tokens, completion.prompt_tokens)
        if self.answered is not None:
            await self.answered()
        return Response(answer.body, headers={**answer.headers, **self.headers})

    def output(self, lookup: Lookup) -> DeltaSource:
        """Where the response's deltas come from: the engine, run for this request alone or
        for every identical one (`lookup.leads`), or an identical request's run."""
        service, run = self.model.service, self.run
        flight = lookup.flight
        if flight is None:
            if self.stream and run.plain_stream():
                # Nothing collects this stream: the engine may hand on its own events.
                run = self.run = run.passing_through()
            return service.generate(run)
        if lookup.leads:
            return flight.lead(service.generate(run))
        self.follows = True
        return flight.follow(lambda: service.generate(run), self.stream, self._fell_back)

    async def stream_events(self, deltas: DeltaSource) -> Response:
        events = self.model.service.stream(
            self.run, on_finish=self._finish, deltas=deltas, on_end=self._settle
        )
        writer = stream_writer(self.run.format)
        timeouts = self.state.timeouts
        # Silent for `keepalive` seconds, mid-stream or before the first event, a stream
        # sends its ping; Anthropic's begins sooner, with events of its own (`message_start`).
        every = timeouts.keepalive
        if opens_early(writer):
            early = min(timeouts.ping_after, every)
            keepalive = Keepalive(writer.ping(), every, after=early, opening=writer.opening)
        else:
            keepalive = Keepalive(writer.ping(), every, after=every)
        return await open_event_stream(
            self.request.receive,
            events,
            headers=self.headers,
            deadline=self.deadline,
            stall_limit=timeouts.stream_stall,
            ending=writer,
            keepalive=keepalive,
        )

    async def collect(self, deltas: DeltaSource) -> Response:
        try:
            completion = await until_disconnect(
                self.request.receive,
                self.model.service.collect(self.run, deltas, on_end=self._settle),
                self._time_left(),
            )
        finally:
            await deltas.aclose()  # also when the collection never started
        body = self.run.format.response(completion)
        await self._finish(completion)
        return JSONResponse(body, headers=self.headers)

    async def _finish(self, completion: Completion) -> None:
        """The response ended normally (its tokens are settled by `on_end`)."""
        if self.follows and (record := current_request()) is not None:
            # A follower's tokens were generated for another request (which counts them).
            record.add_usage(completion.prompt_tokens, completion.completion_tokens)
        if self.answered is not None:
            await self.answered()

    def _fell_back(self) -> None:
        """The run this request followed was lost before it gave any output: it generates
        its own, a miss."""
        self.follows = False
        if self.reservation is not None:
            self.state.quotas.runs_itself(self.reservation, self.run.expected_choices)
        if self.traffic is not None:
            self.traffic.runs("MISS")
        self.headers.update({"x-cache": "MISS"})
        self.headers.pop("age", None)

    def _runs_elsewhere(self) -> None:
        """No engine work of its own (a hit, or following another run): no sequences held."""
        if self.reservation is not None:
            self.state.quotas.runs_elsewhere(self.reservation)

    async def _settle(self, completion_tokens: int, prompt_tokens: int) -> None:
        """Charge what the run used (nothing for a run no engine took up) instead of what
        was reserved; free its sequences. Runs once, however the exchange ended, even for
        each model of a fallback chain (`Quotas.release` ignores later calls)."""
        if self.reservation is not None:
            await self.state.quotas.release(self.reservation, completion_tokens, prompt_tokens)

    def _time_left(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()
