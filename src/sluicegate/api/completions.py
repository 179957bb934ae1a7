"""`POST /v1/chat/completions` and `POST /v1/completions`.

Each route prepares a `Run` (the service: model, limits, template, token budget) and hands
it to `Exchange.respond`, whose steps read top to bottom: admit (rate limits), look up (the
response cache), then answer from the cache, or stream or collect the output: the engine's,
or an identical request's in flight (`cache.flight`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import StateDep
from sluicegate.cache.response_cache import Lookup
from sluicegate.http.asgi import api_key_id
from sluicegate.http.cache_hits import body_fingerprint, cache_control
from sluicegate.http.disconnect import until_disconnect
from sluicegate.http.sse import open_event_stream
from sluicegate.http.state import AppState
from sluicegate.inference.run import Run
from sluicegate.inference.service import DeltaSource
from sluicegate.observability.record import current_request
from sluicegate.observability.tracing import span
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import render_cached
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1", tags=["completions"])
# Tokenizing the request and fitting it to the context window: the token budget.
TOKEN_BUDGET_SPAN = "token_budget"


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    with span(TOKEN_BUDGET_SPAN):
        run = await state.service.prepare_chat(body)
    return await Exchange.start(run, body.stream, request, state).respond()


@router.post("/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    with span(TOKEN_BUDGET_SPAN):
        run = await state.service.prepare_completion(body)
    return await Exchange.start(run, body.stream, request, state).respond()


@dataclass(slots=True)
class Exchange:
    """One prepared inference request on its way to a response."""

    run: Run
    stream: bool
    request: Request
    state: AppState
    key_id: str
    deadline: float
    """Event-loop time by which the whole response must be sent (`request_timeout`)."""
    headers: dict[str, str] = field(default_factory=dict)
    follows: bool = False
    """Whether the response comes from an identical request's run."""

    @classmethod
    def start(cls, run: Run, stream: bool, request: Request, state: AppState) -> Exchange:
        deadline = asyncio.get_running_loop().time() + state.timeouts.request
        return cls(run, stream, request, state, api_key_id(request.scope), deadline)

    async def respond(self) -> Response:
        await self.admit()
        lookup = await self.look_up()
        if lookup.completion is not None:
            return await self.answer_from_cache(lookup.completion)
        deltas = self.output(lookup)
        if self.stream:
            return await self.stream_events(deltas)
        return await self.collect(deltas)

    async def admit(self) -> None:
        """Count the request against its key's rate limits (429 when one is used up)."""
        self.headers.update(await self.state.quotas.admit(self.key_id, self.run.prompt_tokens))
        if self.run.budget is not None:
            self.headers.update(self.run.budget.headers())

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
            record.add_usage(completion.prompt_tokens, completion.completion_tokens)
        await self.state.quotas.settle(self.key_id, completion.completion_tokens)
        return Response(answer.body, headers={**answer.headers, **self.headers})

    def output(self, lookup: Lookup) -> DeltaSource:
        """Where the response's deltas come from: the engine, run for this request alone or
        for every identical one (`lookup.leads`), or an identical request's run."""
        service, run = self.state.service, self.run
        flight = lookup.flight
        if flight is None:
            return service.generate(run)
        if lookup.leads:
            return flight.lead(service.generate(run))
        self.follows = True
        return flight.follow(lambda: service.generate(run), self.stream, self._fell_back)

    async def stream_events(self, deltas: DeltaSource) -> Response:
        events = self.state.service.stream(self.run, on_finish=self._finish, deltas=deltas)
        return await open_event_stream(
            self.request.receive,
            events,
            headers=self.headers,
            deadline=self.deadline,
            stall_limit=self.state.timeouts.stream_stall,
        )

    async def collect(self, deltas: DeltaSource) -> Response:
        try:
            completion = await until_disconnect(
                self.request.receive,
                self.state.service.collect(self.run, deltas),
                self._time_left(),
            )
        finally:
            await deltas.aclose()  # also when the collection never started
        await self._finish(completion)
        return JSONResponse(self.run.format.response(completion), headers=self.headers)

    async def _finish(self, completion: Completion) -> None:
        """The response ended normally: settle its completion tokens."""
        if self.follows and (record := current_request()) is not None:
            # A follower's tokens were generated for another request (which counts them).
            record.add_usage(completion.prompt_tokens, completion.completion_tokens)
        await self.state.quotas.settle(self.key_id, completion.completion_tokens)

    def _fell_back(self) -> None:
        """The run this request followed was lost before it gave any output: it generates
        its own, a miss."""
        self.follows = False
        self.headers.update({"x-cache": "MISS"})
        self.headers.pop("age", None)

    def _time_left(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()
