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
from typing import Any, Protocol, TypeVar

from sluicegate.engine.protocol import (
    ChatPrompt,
    ChoiceDelta,
    EngineClient,
    EngineStep,
    Prompt,
    PromptTokenizer,
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
)
from sluicegate.errors import InvalidRequestError
from sluicegate.inference.admission import EngineAdmission
from sluicegate.inference.budget import BudgetPolicy, BudgetReport, FittedPrompts, TokenBudget
from sluicegate.inference.images import CountedImages, RequestImages
from sluicegate.inference.reasoning import ReasoningSplit, chat_shaped
from sluicegate.inference.run import Echo, RequestLimits, Run
from sluicegate.inference.structured import (
    ConstraintCheck,
    StructuredLimits,
    forced_tool_call,
    requested_constraint,
)
from sluicegate.inference.telemetry import GenerationTelemetry, count_structured
from sluicegate.observability.record import mark_prepared
from sluicegate.wire.completion import Collector, Completion
from sluicegate.wire.events import StreamWriter, stream_writer
from sluicegate.wire.formats import ChatFormat, CompletionFormat, chat_format, completion_format
from sluicegate.wire.passthrough import PassThroughWriter, passes_through
from sluicegate.wire.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    Truncation,
)
from sluicegate.wire.response_format import ResponsesFormat
from sluicegate.wire.tools import ToolSetup

T = TypeVar("T")
OnEnd = Callable[[int, int], Awaitable[None]]
"""Told the tokens a run used, once it has ended: its completion tokens, and the prompt
tokens the engine took up (none when it never began: refused or failed before its first
step, or abandoned before it)."""


class DeltaSource(Protocol):
    """Where a response's deltas come from: the engine (`CompletionService.generate`), or
    another identical request's live output (`cache.flight`). Closing it ends the reading."""

    def __aiter__(self) -> AsyncIterator[ChoiceDelta]: ...

    def __anext__(self) -> Awaitable[ChoiceDelta]: ...

    def aclose(self) -> Awaitable[None]: ...


class CompletionService:
    def __init__(
        self,
        engine: EngineClient,
        model_name: str,
        limits: RequestLimits | None = None,
        budget: BudgetPolicy | None = None,
        structured: StructuredLimits | None = None,
        admission: EngineAdmission | None = None,
        *,
        identity: str = "",
        adapter: str | None = None,
    ):
        """`model_name` is the name its answers carry; `identity` what they depend on besides
        the request (the weights: the cache key holds it); `adapter` the LoRA adapter the
        engine runs with. `admission` is the engine's (`inference.admission`), shared by
        every service on it."""
        self.engine = engine
        self.model_name = model_name
        self.identity = identity or model_name
        self._adapter = adapter
        self._engine = engine
        self._admission = admission or EngineAdmission(engine)
        self._model_name = model_name
        self._limits = limits or RequestLimits()
        self._structured = structured or StructuredLimits()
        self._constraints = ConstraintCheck(engine.check_structured)
        self._policy = budget or BudgetPolicy()
        self._tokenizer = engine.tokenizer
        self._budget = (
            None
            if self._tokenizer is None
            else TokenBudget(self._tokenizer, engine.max_model_len, self._policy)
        )
        self._text_prefix: int | None = None

    # ---- preparing ----------------------------------------------------------------------

    async def prepare_chat(
        self, request: ChatCompletionRequest, images: RequestImages | None = None
    ) -> Run:
        """`images`: the request's images (`request.image_parts()`), read here once the
        cheaper checks passed, and once for all the models of a fallback chain."""
        arrival_time = time.time()
        if len(request.messages) > self._limits.max_messages:
            raise InvalidRequestError(
                f"At most {self._limits.max_messages} messages are accepted.", param="messages"
            )
        self._check_images(request, images)
        self._check_sampling(request)
        self._limits.check_sequences(1, request.n)
        tools = request.tool_setup(self._limits.tools)
        structured = await self._constraint(request, tools)
        messages = request.prompt_messages()
        counted = CountedImages((), 0, True)

        async def image_tokens() -> tuple[int, bool]:
            # Asked by the budget once the text fits: the images are read only then.
            nonlocal counted
            assert images is not None
            counted = await images.counted(self._engine)
            return counted.tokens, counted.exact

        if self._budget is None:
            if images:
                await image_tokens()
            fitted = self._unfitted(request, [[]], messages)
        else:
            fitted = await self._budget.fit_chat(
                messages,
                max_tokens=request.completion_limit(),
                min_tokens=request.min_tokens,
                truncation=request.truncation,
                tools=tools.tools,
                template_kwargs=_template_kwargs(request),
                image_tokens=image_tokens if images else None,
            )
        chat = None
        if self._engine.renders_chat:
            chat = ChatPrompt(
                fitted.messages or messages,
                tools.tools or None,
                tools.choice() if tools.tools else None,
                tools.parallel,
            )
        fmt = chat_format(
            self._model_name,
            request.include_usage,
            tools,
            self._engine.tool_parser,
            reasons=self._engine.reasoning_parser is not None,
            include_reasoning=request.include_reasoning,
        )
        options = self._options(request, fitted, structured)
        prompts = [
            Prompt(
                ids,
                chat=chat,
                images=counted.images,
                image_tokens=counted.tokens,
                images_estimated=not counted.exact,
            )
            for ids in fitted.prompts
        ]
        return self._prepared(request, fmt, prompts, options, arrival_time, fitted.report)

    async def count_chat(
        self, request: ChatCompletionRequest, images: RequestImages | None = None
    ) -> int:
        """The prompt tokens the token budget counts for `request` before fitting it: its
        messages through the chat template, its tools included, its images' tokens (read
        for it: exact in process, estimated upstream) (Anthropic's `count_tokens`)."""
        if self._tokenizer is None:
            raise InvalidRequestError(
                "This model's tokens cannot be counted here: its upstreams have no /tokenize "
                "and no tokenizer is configured for it."
            )
        if len(request.messages) > self._limits.max_messages:
            raise InvalidRequestError(
                f"At most {self._limits.max_messages} messages are accepted.", param="messages"
            )
        self._check_images(request, images)
        tools = request.tool_setup(self._limits.tools)
        extra = 0 if images is None else (await images.counted(self._engine)).tokens
        # Exact within the context window, as the budget counts the run: a count by parts
        # (what longer prompts get) differs where tokens merge across them.
        encoding = await self._tokenizer.encode_chat_counted(
            request.prompt_messages(),
            ids_up_to=self._engine.max_model_len,
            tools=tools.tools,
            template_kwargs=_template_kwargs(request),
        )
        return encoding.length + extra

    async def prepare_completion(self, request: CompletionRequest) -> Run:
        arrival_time = time.time()
        batch = request.prompts()
        if len(batch) > self._limits.max_prompts:
            raise InvalidRequestError(
                f"At most {self._limits.max_prompts} prompts are accepted.", param="prompt"
            )
        self._check_sampling(request)
        self._limits.check_sequences(len(batch), request.n)
        structured = await self._constraint(request)
        fmt = completion_format(self._model_name, request.include_usage)
        if self._budget is None:
            if request.echo:
                raise InvalidRequestError(
                    "echo needs the model's tokenizer, which this gateway does not have "
                    "(set SLUICEGATE_TOKENIZER).",
                    param="echo",
                )
            fitted = self._unfitted(request, [p if isinstance(p, list) else [] for p in batch])
            prompts = [Prompt(p) if isinstance(p, list) else Prompt([], text=p) for p in batch]
            options = self._options(request, fitted, structured)
            return self._prepared(request, fmt, prompts, options, arrival_time, None)
        as_text = isinstance(batch[0], str)
        encoded = [await self._encode_prompt(p, request.truncation) for p in batch]
        fitted = await self._budget.fit_prompts(
            encoded,
            # Scoring a prompt still takes one generated token (vLLM's server asks for one).
            max_tokens=1 if request.scores_only else request.completion_limit(),
            min_tokens=request.min_tokens,
            truncation=request.truncation,
            # Text prompts keep the special tokens the tokenizer puts first (a BOS).
            keep_prefix=await self._text_prefix_length() if as_text else 0,
        )
        options = self._options(request, fitted, structured)
        # Text kept whole goes as text too, for an engine that tokenizes it itself.
        whole = self._whole_texts(batch, encoded, fitted.prompts)
        echo = None
        if request.echo:
            echo = await self._echo(whole, fitted.prompts, request.scores_only)
        prompts = [Prompt(ids, text=text) for ids, text in zip(fitted.prompts, whole, strict=True)]
        return self._prepared(request, fmt, prompts, options, arrival_time, fitted.report, echo)

    async def _echo(
        self, whole: list[str | None], fitted: list[list[int]], scores_only: bool
    ) -> Echo:
        """What `echo` puts first: the prompt text as sent (as vLLM's server does), or the
        ids the engine gets, detokenized, when they were sent as ids or cut to fit."""
        tokenizer = self._counting()
        texts: list[str] = []
        for text, kept in zip(whole, fitted, strict=True):
            texts.append(await tokenizer.decode(kept) if text is None else text)
        firsts = [await tokenizer.decode(ids[:1]) for ids in fitted]
        return Echo(tuple(texts), tuple(firsts), scores_only)

    def _whole_texts(
        self, batch: list[str | list[int]], encoded: list[list[int]], fitted: list[list[int]]
    ) -> list[str | None]:
        """Each prompt's text as sent, where it was sent as text and kept whole: not cut
        before tokenizing (too many characters) nor after (too many tokens)."""
        budget = self._counted_budget()
        return [
            sent if isinstance(sent, str) and kept is ids and budget.fits_whole(sent) else None
            for sent, ids, kept in zip(batch, encoded, fitted, strict=True)
        ]

    async def _text_prefix_length(self) -> int:
        """How many special tokens (a BOS) the tokenizer puts before any text; asked once."""
        if self._text_prefix is None:
            self._text_prefix = len(await self._counting().encode(""))
        return self._text_prefix

    def _counting(self) -> PromptTokenizer:
        """The tokenizer, on paths that only run with the token budget on."""
        assert self._tokenizer is not None
        return self._tokenizer

    def _counted_budget(self) -> TokenBudget:
        assert self._budget is not None
        return self._budget

    def _unfitted(
        self,
        request: SamplingRequest,
        prompts: list[list[int]],
        messages: list[dict[str, Any]] | None = None,
    ) -> FittedPrompts:
        """With no tokenizer, nothing is fitted: the engine gets the prompts as they are and
        decides the length unless the client did. `max_tokens` then only bounds what the
        rate limits reserve."""
        asked = request.completion_limit()
        limit = self._policy.default_max_tokens if asked is None else asked
        return FittedPrompts(prompts, max(limit, request.min_tokens), None, messages)

    async def _encode_prompt(
        self, prompt: str | list[int], truncation: Truncation | None
    ) -> list[int]:
        """A text prompt's token ids, or given ids once checked against the vocabulary."""
        tokenizer = self._counting()
        if isinstance(prompt, str):
            return await tokenizer.encode(self._counted_budget().bound_text(prompt, truncation))
        vocab = tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        return prompt

    def _check_images(self, request: ChatCompletionRequest, images: RequestImages | None) -> None:
        """A model that reads text only refuses images before anything is read; the bound on
        their number holds before anything is rendered."""
        if images is None:
            if request.image_parts():  # a caller that forgot them: refused, never ignored
                raise InvalidRequestError("Images are not read on this endpoint.")
            return
        if not self._engine.takes_images:
            images.refuse_text_only()
        images.check_count()

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
        if requested is not None and request.min_tokens > requested:
            raise InvalidRequestError(
                f"min_tokens must be at most max_tokens ({requested}).", param="min_tokens"
            )
        stop = request.stop_list()
        if len(stop) > limits.max_stop_sequences:
            raise InvalidRequestError(
                f"At most {limits.max_stop_sequences} stop sequences are accepted.", param="stop"
            )
        if any(len(s) > limits.max_stop_length for s in stop):
            raise InvalidRequestError(
                f"Stop sequences must be at most {limits.max_stop_length} characters long.",
                param="stop",
            )
        # Without a tokenizer the engine (an upstream) checks the ids itself.
        vocab = self._tokenizer.vocab_size if self._tokenizer is not None else None
        outside = [i for i, _ in request.logit_bias_pairs() if vocab is not None and i >= vocab]
        if outside:
            raise InvalidRequestError(
                f"logit_bias token ids must be in [0, {vocab}); {outside[0]} is not.",
                param="logit_bias",
            )
        if request.n > 1 and (_or(request.temperature, 1.0) == 0 or request.top_k == 1):
            raise InvalidRequestError(
                "n must be 1 with greedy sampling (temperature 0 or top_k 1): "
                "every choice would be the same",
                param="n",
            )

    async def _constraint(
        self, request: SamplingRequest, tools: ToolSetup | None = None
    ) -> StructuredOutput | None:
        """The request's structured-output constraint, checked (400 naming the parameter).

        `tool_choice` "required" or a named function wins over `response_format`, as in
        vLLM's server: the output can only be calls whose arguments validate."""
        requested = requested_constraint(request, self._structured)
        if tools is not None:
            await self._constraints.check_tools(tools)
            # An engine that renders chats enforces `tool_choice` itself.
            forced = None if self._engine.renders_chat else tools.forced_schema()
            if (schema := forced) is not None:
                requested = forced_tool_call(schema, self._structured)
        if requested is None:
            return None
        count_structured(requested.kind, await self._constraints.check(requested))
        return requested.output

    def _options(
        self,
        request: SamplingRequest,
        fitted: FittedPrompts,
        structured: StructuredOutput | None = None,
    ) -> SamplingOptions:
        """The engine's sampling options, with the max_tokens the token budget gave."""
        return SamplingOptions(
            max_tokens=fitted.max_tokens,
            max_tokens_given=fitted.report is not None or request.completion_limit() is not None,
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
            structured=structured,
            logit_bias=request.logit_bias_pairs(),
            prompt_logprobs=(
                request.prompt_logprobs_k() if isinstance(request, CompletionRequest) else None
            ),
            reasoning=(
                request.reasoning_options() if isinstance(request, ChatCompletionRequest) else None
            ),
        )

    def _prepared(
        self,
        request: SamplingRequest,
        fmt: ChatFormat | CompletionFormat,
        prompts: list[Prompt],
        options: SamplingOptions,
        arrival_time: float,
        budget: BudgetReport | None,
        echo: Echo | None = None,
    ) -> Run:
        """The run of a request whose prompts are ready: the timeline's `prepared` mark is
        now."""
        mark_prepared()
        return Run(
            fmt.id,
            prompts,
            options,
            fmt,
            arrival_time,
            request.include_usage,
            budget,
            priority=request.priority,
            echo=echo,
            model=self.model_name,
            identity=self.identity,
        )

    # ---- running ------------------------------------------------------------------------

    async def generate(self, run: Run) -> AsyncGenerator[ChoiceDelta, None]:
        """The run's deltas from the engine, indexed as the response's choices. Closing this
        generator early aborts the run in the engine."""
        echo = run.echo
        split = self._split(run)
        async with contextlib.aclosing(self._steps(run)) as steps:
            if echo is None:
                async for prompt_index, step in steps:
                    for delta in step.choices:
                        delta.index = run.choice_index(prompt_index, delta.index)
                        if split is not None:
                            split.split(delta)
                        else:
                            delta.token_ids = None
                        yield delta
                return
            echoing = _Echoing(echo, with_logprobs=run.options.prompt_logprobs is not None)
            async for prompt_index, step in steps:
                echoing.add(prompt_index, step.prompt_logprobs)
                for delta in step.choices:
                    delta.index = run.choice_index(prompt_index, delta.index)
                    delta.token_ids = None
                    for echoed in echoing.deltas(prompt_index, delta):
                        yield echoed

    def _split(self, run: Run) -> ReasoningSplit | None:
        """The run's reasoning split: when the engine has a parser and the run is a chat."""
        parser = self._engine.reasoning_parser
        if parser is None or not chat_shaped(run.format):
            return None
        reasoning = run.options.reasoning
        kwargs = {} if reasoning is None else reasoning.kwargs()
        return ReasoningSplit(parser, run.prompts, run.options.n, kwargs)

    async def collect(
        self, run: Run, deltas: DeltaSource | None = None, on_end: OnEnd | None = None
    ) -> Completion:
        """Run to completion; `run.format.response(completion)` is the OpenAI body.

        `deltas` is where the output comes from (the engine by default; the response cache
        hands in another request's live output); it is closed with the collection. `on_end`
        gets the tokens used however the run ended: finished, failed, or cancelled (the client
        left, the time ran out)."""
        collector = Collector(range(run.expected_choices))
        source = self.generate(run) if deltas is None else deltas
        answered = False
        try:
            async with contextlib.aclosing(source):
                async for delta in source:
                    answered = True
                    collector.add(delta)
        finally:
            if on_end is not None:
                produced = collector.completion(run.prompt_tokens).completion_tokens
                await on_end(produced, run.used_prompt_tokens(answered))
        return collector.completion(run.prompt_tokens)

    def stream(
        self,
        run: Run,
        on_finish: Callable[[Completion], Awaitable[None]] | None = None,
        deltas: DeltaSource | None = None,
        on_end: OnEnd | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """SSE events for the run, without the closing `[DONE]` (the stream layer adds it).

        `on_finish` gets what the run produced (counts only: a stream keeps no text) once it
        has ended normally; `on_end` the tokens used, however the stream ended (finished,
        failed, abandoned). `deltas` as for `collect`."""
        source = self.generate(run) if deltas is None else deltas
        return _events(run, source, on_finish, on_end)

    async def _steps(self, run: Run) -> AsyncGenerator[tuple[int, EngineStep], None]:
        """Engine steps of every prompt of the run, tagged with the prompt's index.

        Every step also feeds the run's telemetry (TTFT, inter-token latency, tokens, span)."""
        # A Responses run is a chat run in another format.
        fmt = run.format.chat if isinstance(run.format, ResponsesFormat) else run.format
        operation = "text_completion" if isinstance(fmt, CompletionFormat) else "chat"
        tools = fmt.tools if isinstance(fmt, ChatFormat) else None
        # Refused here, before any engine work, when the engine holds as much as it may, or
        # when the first token would come too late.
        ticket = self._admission.admit(
            run.prompt_tokens,
            time.time() - run.arrival_time,
            # A grammar compiled for the run delays its first token past what the queue
            # foretells; it must not teach the estimate (`prefill_queue`).
            learns=run.options.structured is None,
            priority=run.priority,
            key=run.key_id,
        )
        try:
            with GenerationTelemetry(
                operation, self._model_name, run.id, run.prompt_tokens, run.options, tools
            ) as telemetry:

                def seen(prompt_index: int, step: EngineStep) -> None:
                    run.began.add(prompt_index)
                    if telemetry.step(prompt_index, step):
                        # Its first token came after a failed try elsewhere (an upstream
                        # retried): a delay the queue does not model, not taught.
                        ticket.learns = ticket.learns and not step.retried
                        ticket.started()
                    _count_prompt(run, prompt_index, step)

                if len(run.prompts) == 1:
                    # The one prompt's steps, read here: a generator less on every step.
                    steps = self._engine.generate(
                        run.engine_request_id(0),
                        run.prompts[0],
                        run.options,
                        arrival_time=run.arrival_time,
                        priority=run.priority,
                        adapter=self._adapter,
                    )
                    async with contextlib.aclosing(steps):
                        async for step in steps:
                            seen(0, step)
                            yield 0, step
                    return
                async with contextlib.aclosing(_merge(self._engine, run, self._adapter)) as each:
                    async for prompt_index, step in each:
                        seen(prompt_index, step)
                        yield prompt_index, step
        finally:
            ticket.close()


class _Echoing:
    """Puts each choice's prompt (and its logprobs) before the choice's own output.

    The prompt goes first as a delta of its own, so the response cache stores it with the
    rest and a hit renders the same answer."""

    def __init__(self, echo: Echo, with_logprobs: bool) -> None:
        self._echo = echo
        self._with_logprobs = with_logprobs
        self._prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}
        self._echoed: set[int] = set()

    def add(self, prompt_index: int, logprobs: list[TokenLogprob | None] | None) -> None:
        if logprobs:  # vLLM may send a long prompt's logprobs in parts
            self._prompt_logprobs.setdefault(prompt_index, []).extend(logprobs)

    def deltas(self, prompt_index: int, delta: ChoiceDelta) -> Iterator[ChoiceDelta]:
        echo = self._echo
        if delta.index not in self._echoed:
            self._echoed.add(delta.index)
            yield ChoiceDelta(
                delta.index, echo.texts[prompt_index], 0, None, self._logprobs(prompt_index)
            )
        if echo.scores_only:
            yield ChoiceDelta(delta.index, "", 0, delta.finish_reason)
        else:
            yield delta

    def _logprobs(self, prompt_index: int) -> list[TokenLogprob] | None:
        if not self._with_logprobs:
            return None
        first = TokenLogprob(self._echo.first_tokens[prompt_index], None)
        return [first if e is None else e for e in self._prompt_logprobs.get(prompt_index, ())]


async def _events(
    run: Run,
    deltas: DeltaSource,
    on_finish: Callable[[Completion], Awaitable[None]] | None,
    on_end: OnEnd | None = None,
) -> AsyncGenerator[bytes, None]:
    """SSE events from the run's deltas; the deltas are closed (aborting the run) with them.

    Each piece is what one delta adds, its events joined: one write to the client (an empty
    one, not sent, for a delta that shows nothing: the engine moved all the same). The delta
    that finishes the run's last choice is followed by nothing but the end of the deltas, so
    its events wait for the closing ones and go with them.

    `on_finish` runs after the closing events are rendered but before they are sent, so what
    it does (storing a response) is done by the time a client reads the end of the stream."""
    fmt = run.format
    if run.options.pass_through and passes_through(fmt):
        writer: StreamWriter = PassThroughWriter(fmt)
    else:
        writer = stream_writer(fmt)
    unfinished = run.expected_choices
    last = b""
    answered = False
    try:
        async with contextlib.aclosing(deltas):
            try:
                async for delta in deltas:
                    answered = True
                    events = b"".join(writer.events(delta))
                    if delta.finish_reason is not None:
                        unfinished -= 1
                    if unfinished <= 0 or last:
                        last += events
                    else:
                        # Empty when the delta shows nothing (thoughts left out, text a
                        # parser holds): still the engine's progress, which the stream's
                        # stall bound counts (`http.sse`), though nothing is sent.
                        yield events
            except Exception:
                if last:
                    yield last  # what came before the failure, then its error event
                raise
        completion = writer.completion(run.prompt_tokens)
        closing = b"".join(writer.closing(completion, run.include_usage))
        if on_finish is not None:
            await on_finish(completion)
        if last or closing:
            yield last + closing
    finally:
        # Also when the stream is closed early: the tokens sent so far were produced.
        if on_end is not None:
            produced = writer.completion(run.prompt_tokens).completion_tokens
            await on_end(produced, run.used_prompt_tokens(answered))


async def _merge(
    engine: EngineClient, run: Run, adapter: str | None
) -> AsyncGenerator[tuple[int, EngineStep], None]:
    """Run a batch of prompts concurrently; cancelling the consumer cancels them all."""
    queue: asyncio.Queue[tuple[int, EngineStep] | BaseException | None] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            steps = engine.generate(
                run.engine_request_id(index),
                run.prompts[index],
                run.options,
                arrival_time=run.arrival_time,
                priority=run.priority,
                adapter=adapter,
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


def _count_prompt(run: Run, prompt_index: int, step: EngineStep) -> None:
    """Keep the engine's count of a prompt whose ids the gateway does not know, or whose
    images it could only estimate."""
    prompt = run.prompts[prompt_index]
    if step.prompt_tokens and (not prompt.ids or prompt.images_estimated):
        run.counted[prompt_index] = step.prompt_tokens


def _template_kwargs(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The chat template's arguments the request asks for (`reasoning_effort`,
    `chat_template_kwargs`), as the engine's options carry them; None: none."""
    reasoning = request.reasoning_options()
    return None if reasoning is None else reasoning.kwargs() or None


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
