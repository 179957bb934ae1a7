"""Chat and text completions: from a validated request to engine runs and OpenAI bodies.

The service knows nothing of HTTP. It raises `errors.GatewayError`s; the API layer renders
them. A request becomes a `Run` (tokenized prompts plus filled-in sampling options), which is
then either collected into one response or streamed as SSE events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sluicegate.engine.protocol import EngineClient, EngineStep, SamplingOptions
from sluicegate.errors import (
    ContextLengthExceededError,
    EngineUnavailableError,
    InvalidRequestError,
    ModelNotFoundError,
)
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from sluicegate.responses import (
    ChatFormat,
    ChoiceState,
    CompletionFormat,
    ResponseFormat,
    usage,
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
    include_usage: bool = False

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
    def __init__(self, engine: EngineClient, model_name: str, limits: RequestLimits | None = None):
        self._engine = engine
        self._model_name = model_name
        self._limits = limits or RequestLimits()

    # ---- preparing ----------------------------------------------------------------------

    async def prepare_chat(self, request: ChatCompletionRequest) -> Run:
        self._check_model(request.model)
        if len(request.messages) > self._limits.max_messages:
            raise InvalidRequestError(
                f"At most {self._limits.max_messages} messages are accepted.", param="messages"
            )
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in request.messages
        ]
        prompt = await self._engine.tokenizer.encode_chat(messages)
        run_id = f"chatcmpl-{uuid.uuid4().hex}"
        fmt = ChatFormat(run_id, int(time.time()), self._model_name, request.include_usage)
        options = self._options(request, [prompt], "messages")
        return Run(run_id, [prompt], options, fmt, request.include_usage)

    async def prepare_completion(self, request: CompletionRequest) -> Run:
        self._check_model(request.model)
        prompt = request.prompt
        batch = isinstance(prompt, list) and not isinstance(prompt[0], int)
        if batch and len(prompt) > self._limits.max_prompts:
            raise InvalidRequestError(
                f"At most {self._limits.max_prompts} prompts are accepted.", param="prompt"
            )
        prompts = await self._encode_prompts(request.prompt)
        run_id = f"cmpl-{uuid.uuid4().hex}"
        fmt = CompletionFormat(run_id, int(time.time()), self._model_name, request.include_usage)
        options = self._options(request, prompts, "prompt")
        return Run(run_id, prompts, options, fmt, request.include_usage)

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

    def _options(
        self,
        request: SamplingRequest,
        prompts: list[list[int]],
        prompt_param: str,
    ) -> SamplingOptions:
        limit = self._engine.max_model_len
        longest = max(len(p) for p in prompts)
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
        if longest >= limit or (requested is not None and longest + requested > limit):
            wanted = longest + (requested or 1)
            raise ContextLengthExceededError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {wanted} tokens ({longest} in the {prompt_param}, "
                f"{requested or 1} in the completion). Please reduce the length of the "
                f"{prompt_param} or completion.",
                param=prompt_param,
            )
        temperature = _or(request.temperature, 1.0)
        if request.n > 1 and (temperature == 0 or request.top_k == 1):
            raise InvalidRequestError(
                "n must be 1 with greedy sampling (temperature 0 or top_k 1): "
                "every choice would be the same",
                param="n",
            )
        return SamplingOptions(
            max_tokens=requested if requested is not None else limit - longest,
            temperature=temperature,
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

    async def collect(self, run: Run) -> dict[str, Any]:
        """Run to completion and return the OpenAI response body."""
        choices = {
            run.choice_index(p, i): ChoiceState(run.choice_index(p, i))
            for p in range(len(run.prompts))
            for i in range(run.options.n)
        }
        with_logprobs = run.options.logprobs is not None
        async for prompt_index, step in self._steps(run):
            for delta in step.choices:
                state = choices[run.choice_index(prompt_index, delta.index)]
                state.text_parts.append(delta.text)
                state.num_tokens += delta.num_tokens
                if with_logprobs:
                    if state.logprobs is None:
                        state.logprobs = []
                    state.logprobs.extend(delta.logprobs or ())
                if delta.finish_reason is not None:
                    state.finish_reason = _checked_finish(delta.finish_reason)
        ordered = [choices[k] for k in sorted(choices)]
        completion_tokens = sum(c.num_tokens for c in ordered)
        return run.format.response(ordered, usage(run.prompt_tokens, completion_tokens))

    async def stream(
        self, run: Run, on_finish: Callable[[int], Awaitable[None]] | None = None
    ) -> AsyncGenerator[bytes, None]:
        """SSE events for the run, without the closing `[DONE]` (the stream layer adds it).

        `on_finish` gets the completion token count once the run has ended normally."""
        fmt = run.format
        states: dict[int, ChoiceState] = {}
        completion_tokens = 0
        async for prompt_index, step in self._steps(run):
            for delta in step.choices:
                index = run.choice_index(prompt_index, delta.index)
                delta.index = index
                state = states.get(index)
                if state is None:
                    state = states[index] = ChoiceState(index)
                    first = fmt.first_chunk(index)
                    if first is not None:
                        yield sse_event(first)
                completion_tokens += delta.num_tokens
                state.text_length += len(delta.text)
                if delta.text or delta.logprobs:
                    yield sse_event(fmt.delta_chunk(state, delta))
                if delta.finish_reason is not None:
                    yield sse_event(fmt.finish_chunk(index, _checked_finish(delta.finish_reason)))
        if run.include_usage:
            yield sse_event(fmt.usage_chunk(usage(run.prompt_tokens, completion_tokens)))
        if on_finish is not None:
            await on_finish(completion_tokens)

    async def _steps(self, run: Run) -> AsyncIterator[tuple[int, EngineStep]]:
        """Engine steps of every prompt of the run, tagged with the prompt's index."""
        if len(run.prompts) == 1:
            async with contextlib.aclosing(
                self._engine.generate(run.engine_request_id(0), run.prompts[0], run.options)
            ) as steps:
                async for step in steps:
                    yield 0, step
            return
        async for item in _merge(self._engine, run):
            yield item


async def _merge(engine: EngineClient, run: Run) -> AsyncIterator[tuple[int, EngineStep]]:
    """Run a batch of prompts concurrently; cancelling the consumer cancels them all."""
    queue: asyncio.Queue[tuple[int, EngineStep] | BaseException | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            steps = engine.generate(run.engine_request_id(index), run.prompts[index], run.options)
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
