"""Chat and text completions: from a validated request to engine runs and OpenAI bodies.

The service knows nothing of HTTP. It raises `errors.GatewayError`s; the API layer renders
them. A request becomes a `Run` (tokenized prompts plus filled-in sampling options), which is
then either collected into one response or streamed as SSE events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar, cast

from sluicegate.budget import BudgetPolicy, BudgetReport, TokenBudget
from sluicegate.engine.protocol import (
    ChoiceDelta,
    EngineClient,
    EngineStep,
    FinishReason,
    SamplingOptions,
)
from sluicegate.errors import (
    EngineUnavailableError,
    InvalidRequestError,
    ModelNotFoundError,
)
from sluicegate.observability.generation import GenerationTelemetry
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from sluicegate.responses import (
    ChatFormat,
    ChoiceState,
    Completion,
    ResponseFormat,
    chat_format,
    completion_format,
)
from sluicegate.settings import Settings
from sluicegate.streaming import sse_event

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Run:
    """A request ready for the engine."""

    id: str
    prompts: list[list[int]]
    options: SamplingOptions
    format: ResponseFormat
    arrival_time: float
    """Wall-clock time (`time.time()`) at which preparing the request began."""
    include_usage: bool = False
    budget: BudgetReport | None = None

    def engine_request_id(self, prompt_index: int) -> str:
        return self.id if len(self.prompts) == 1 else f"{self.id}-{prompt_index}"

    def choice_index(self, prompt_index: int, index: int) -> int:
        return prompt_index * self.options.n + index

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what one request may ask for; each breach is a 400 naming the parameter."""

    max_messages: int = 2048
    max_prompts: int = 64
    max_n: int = 16
    max_tokens: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(
            max_messages=settings.max_messages,
            max_prompts=settings.max_prompts,
            max_n=settings.max_n,
            max_tokens=settings.max_tokens_limit,
        )


class CompletionService:
    def __init__(
        self,
        engine: EngineClient,
        model_name: str,
        limits: RequestLimits | None = None,
        budget: BudgetPolicy | None = None,
    ):
        self._engine = engine
        self._model_name = model_name
        self._limits = limits or RequestLimits()
        self._budget = TokenBudget(engine.tokenizer, engine.max_model_len, budget or BudgetPolicy())
        self._text_prefix: int | None = None

    # ---- preparing ----------------------------------------------------------------------

    async def prepare_chat(self, request: ChatCompletionRequest) -> Run:
        arrival_time = time.time()
        self._check_model(request.model)
        if len(request.messages) > self._limits.max_messages:
            raise InvalidRequestError(
                f"At most {self._limits.max_messages} messages are accepted.", param="messages"
            )
        self._check_sampling(request)
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in request.messages
        ]
        fitted = await self._budget.fit_chat(
            messages,
            max_tokens=request.completion_limit(),
            min_tokens=request.min_tokens,
            truncation=request.truncation,
        )
        fmt = chat_format(self._model_name, request.include_usage)
        options = self._options(request, fitted.max_tokens)
        return Run(
            fmt.id, fitted.prompts, options, fmt, arrival_time, request.include_usage, fitted.report
        )

    async def prepare_completion(self, request: CompletionRequest) -> Run:
        arrival_time = time.time()
        self._check_model(request.model)
        prompt = request.prompt
        batch = isinstance(prompt, list) and not isinstance(prompt[0], int)
        if batch and len(prompt) > self._limits.max_prompts:
            raise InvalidRequestError(
                f"At most {self._limits.max_prompts} prompts are accepted.", param="prompt"
            )
        self._check_sampling(request)
        prompts = await self._encode_prompts(request.prompt)
        as_text = isinstance(prompt, str) or isinstance(prompt[0], str)
        fitted = await self._budget.fit_prompts(
            prompts,
            max_tokens=request.completion_limit(),
            min_tokens=request.min_tokens,
            truncation=request.truncation,
            # Text prompts keep the special tokens the tokenizer puts first (a BOS).
            keep_prefix=await self._text_prefix_length() if as_text else 0,
        )
        fmt = completion_format(self._model_name, request.include_usage)
        options = self._options(request, fitted.max_tokens)
        return Run(
            fmt.id, fitted.prompts, options, fmt, arrival_time, request.include_usage, fitted.report
        )

    async def _text_prefix_length(self) -> int:
        """How many special tokens (a BOS) the tokenizer puts before any text; asked once."""
        if self._text_prefix is None:
            self._text_prefix = len(await self._engine.tokenizer.encode(""))
        return self._text_prefix

    def _check_model(self, model: str) -> None:
        if model != self._model_name:
            raise ModelNotFoundError(
                f"The model `{model}` does not exist. This server serves `{self._model_name}`.",
                param="model",
            )

    async def _encode_prompts(
        self, prompt: str | list[str] | list[int] | list[list[int]]
    ) -> list[list[int]]:
        tokenizer = self._engine.tokenizer
        if isinstance(prompt, str):
            return [await tokenizer.encode(prompt)]
        if all(isinstance(p, int) for p in prompt):
            token_lists = [list(prompt)]
        elif all(isinstance(p, str) for p in prompt):
            return [await tokenizer.encode(p) for p in prompt]  # type: ignore[arg-type]
        else:
            token_lists = prompt  # type: ignore[assignment]
        vocab = tokenizer.vocab_size
        for tokens in token_lists:
            if any(not 0 <= t < vocab for t in tokens):  # type: ignore[operator]
                raise InvalidRequestError(
                    f"prompt token ids must be in [0, {vocab})", param="prompt"
                )
        return token_lists  # type: ignore[return-value]

    def _check_sampling(self, request: SamplingRequest) -> None:
        """The request's own bounds, checked before any tokenizing."""
        requested = request.completion_limit()
        limits = self._limits
        if request.n > limits.max_n:
            raise InvalidRequestError(f"n must be at most {limits.max_n}.", param="n")
        if (
            limits.max_tokens is not None
            and requested is not None
            and requested > limits.max_tokens
        ):
            raise InvalidRequestError(
                f"max_tokens must be at most {limits.max_tokens}.", param="max_tokens"
            )
        if request.n > 1 and (_or(request.temperature, 1.0) == 0 or request.top_k == 1):
            raise InvalidRequestError(
                "n must be 1 with greedy sampling (temperature 0 or top_k 1): "
                "every choice would be the same",
                param="n",
            )

    def _options(self, request: SamplingRequest, max_tokens: int) -> SamplingOptions:
        """The engine's sampling options; `max_tokens` is what the token budget gave."""
        return SamplingOptions(
            max_tokens=max_tokens,
            temperature=_or(request.temperature, 1.0),
            top_p=_or(request.top_p, 1.0),
            top_k=_or(request.top_k, 0),
            min_p=_or(request.min_p, 0.0),
            n=request.n,
            stop=request.stop_list(),
            seed=request.seed,
            presence_penalty=_or(request.presence_penalty, 0.0),
            frequency_penalty=_or(request.frequency_penalty, 0.0),
            repetition_penalty=_or(request.repetition_penalty, 1.0),
            logprobs=request.logprobs_k(),
            ignore_eos=request.ignore_eos,
            min_tokens=request.min_tokens,
        )

    # ---- running ------------------------------------------------------------------------

    async def collect(self, run: Run) -> Completion:
        """Run to completion; `run.format.response(completion)` is the OpenAI body."""
        choices = {
            run.choice_index(p, i): ChoiceState(run.choice_index(p, i))
            for p in range(len(run.prompts))
            for i in range(run.options.n)
        }
        async for prompt_index, step in self._steps(run):
            for delta in step.choices:
                state = choices[run.choice_index(prompt_index, delta.index)]
                state.add(delta)
                if delta.finish_reason is not None:
                    state.finish_reason = _checked_finish(delta.finish_reason)
        return Completion([choices[k] for k in sorted(choices)], run.prompt_tokens)

    def stream(
        self, run: Run, on_finish: Callable[[Completion], Awaitable[None]] | None = None
    ) -> AsyncGenerator[bytes, None]:
        """SSE events for the run, without the closing `[DONE]` (the stream layer adds it).

        `on_finish` gets what the run produced once it has ended normally."""
        return _events(run, self._steps(run), on_finish)

    def replay(
        self,
        run: Run,
        completion: Completion,
        on_finish: Callable[[Completion], Awaitable[None]] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The events `stream` sent when `completion` was produced: the same deltas again."""
        return _replay(run, completion, on_finish)

    async def _steps(self, run: Run) -> AsyncGenerator[tuple[int, EngineStep], None]:
        """Engine steps of every prompt of the run, tagged with the prompt's index.

        Every step also feeds the run's telemetry (TTFT, inter-token latency, tokens, span)."""
        operation = "chat" if isinstance(run.format, ChatFormat) else "text_completion"
        with GenerationTelemetry(
            operation, self._model_name, run.id, run.prompt_tokens, run.options
        ) as telemetry:
            if len(run.prompts) == 1:
                async with contextlib.aclosing(
                    self._engine.generate(
                        run.engine_request_id(0),
                        run.prompts[0],
                        run.options,
                        arrival_time=run.arrival_time,
                    )
                ) as steps:
                    async for step in steps:
                        telemetry.step(0, step)
                        yield 0, step
                return
            async for prompt_index, step in _merge(self._engine, run):
                telemetry.step(prompt_index, step)
                yield prompt_index, step


class EventWriter:
    """Turns choice deltas into SSE events in a response format, and keeps what they made."""

    def __init__(self, fmt: ResponseFormat) -> None:
        self._fmt = fmt
        self._states: dict[int, ChoiceState] = {}

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        """The events for one delta; `delta.index` is the choice's index in the response."""
        fmt, index = self._fmt, delta.index
        state = self._states.get(index)
        if state is None:
            state = self._states[index] = ChoiceState(index)
            first = fmt.first_chunk(index)
            if first is not None:
                yield sse_event(first)
        state.add(delta)
        if delta.text or delta.logprobs:
            yield sse_event(fmt.delta_chunk(state, delta))
        if delta.finish_reason is not None:
            state.finish_reason = _checked_finish(delta.finish_reason)
            yield sse_event(fmt.finish_chunk(index, state.finish_reason))

    def completion(self, prompt_tokens: int) -> Completion:
        return Completion([self._states[k] for k in sorted(self._states)], prompt_tokens)

    def usage_event(self, completion: Completion) -> bytes:
        return sse_event(self._fmt.usage_chunk(completion.usage))


def replay_events(fmt: ResponseFormat, completion: Completion, include_usage: bool) -> bytes:
    """The events a stream sent when it produced `completion`, delta for delta, in one piece
    (without `[DONE]`). The stream is complete, so nothing is gained by sending it in parts."""
    writer = EventWriter(fmt)
    events: list[bytes] = []
    for choice in completion.choices:
        for delta in choice.deltas():
            events.extend(writer.events(delta))
        finish = cast(FinishReason | None, choice.finish_reason)
        events.extend(writer.events(ChoiceDelta(choice.index, "", choice.num_tokens, finish)))
    if include_usage:
        events.append(writer.usage_event(completion))
    return b"".join(events)


async def _events(
    run: Run,
    steps: AsyncGenerator[tuple[int, EngineStep], None],
    on_finish: Callable[[Completion], Awaitable[None]] | None,
) -> AsyncGenerator[bytes, None]:
    """SSE events from engine steps; the steps are closed (aborting the run) with the events."""
    writer = EventWriter(run.format)
    async with contextlib.aclosing(steps):
        async for prompt_index, step in steps:
            for delta in step.choices:
                delta.index = run.choice_index(prompt_index, delta.index)
                for event in writer.events(delta):
                    yield event
    completion = writer.completion(run.prompt_tokens)
    if run.include_usage:
        yield writer.usage_event(completion)
    if on_finish is not None:
        await on_finish(completion)


async def _replay(
    run: Run,
    completion: Completion,
    on_finish: Callable[[Completion], Awaitable[None]] | None,
) -> AsyncGenerator[bytes, None]:
    yield replay_events(run.format, completion, run.include_usage)
    if on_finish is not None:
        await on_finish(completion)


async def _merge(engine: EngineClient, run: Run) -> AsyncIterator[tuple[int, EngineStep]]:
    """Run a batch of prompts concurrently; cancelling the consumer cancels them all."""
    queue: asyncio.Queue[tuple[int, EngineStep] | BaseException | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            steps = engine.generate(
                run.engine_request_id(index),
                run.prompts[index],
                run.options,
                arrival_time=run.arrival_time,
            )
            async with contextlib.aclosing(steps):
                async for step in steps:
                    queue.put_nowait((index, step))
            queue.put_nowait(None)
        except Exception as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(i)) for i in range(len(run.prompts))]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _checked_finish(reason: str) -> str:
    if reason == "abort":
        # We never abort a request we are still reading: the engine dropped it.
        raise EngineUnavailableError("The inference engine aborted the request.")
    return reason


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
