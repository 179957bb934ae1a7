"""Telemetry of one engine run: TTFT, inter-token latency, tokens, and its span; and, with
the traffic capture on, each sequence's output tokens and finish reason (`TrafficEntry`).

`CompletionService._steps` (`inference.service`) opens a `GenerationTelemetry` around every
run and hands it each engine step; every generated token of every request passes here, so
the per-step work is a clock read and, per token, one histogram observation.

The span follows the OpenTelemetry GenAI conventions (`{operation} {model}`, `gen_ai.*`
attributes) with a `first_token` event. It is started as a child of the request's span but
never made current: a generator resumes in whichever task reads it next, and a context
attached in one task cannot be detached in another.
"""

from __future__ import annotations

import asyncio
import time
from functools import cache
from types import TracebackType
from typing import NamedTuple

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from prometheus_client.metrics import Counter, Histogram

from sluicegate.engine.protocol import EngineStep, SamplingOptions
from sluicegate.observability import metrics
from sluicegate.observability.record import RequestRecord, current_request
from sluicegate.observability.tracing import tracer
from sluicegate.observability.traffic_entry import TrafficEntry
from sluicegate.wire.tools import ToolSetup


class _Series(NamedTuple):
    ttft: Histogram
    itl: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter


@cache
def _series(model: str) -> _Series:
    return _Series(
        metrics.TIME_TO_FIRST_TOKEN.labels(model),
        metrics.INTER_TOKEN_LATENCY.labels(model),
        metrics.PROMPT_TOKENS.labels(model),
        metrics.COMPLETION_TOKENS.labels(model),
    )


def count_structured(kind: str, check_seconds: float) -> None:
    """A request accepted with a structured-output constraint of `kind`; a check that ran
    (not remembered) took `check_seconds`."""
    metrics.STRUCTURED_OUTPUT_REQUESTS.labels(kind).inc()
    if check_seconds:
        metrics.STRUCTURED_OUTPUT_CHECK_SECONDS.observe(check_seconds)


def output_type(options: SamplingOptions) -> str:
    """GenAI's `gen_ai.output.type`: `json` under a JSON schema or JSON object constraint."""
    structured = options.structured
    if structured is not None and (structured.json is not None or structured.json_object):
        return "json"
    return "text"


def tool_attributes(tools: ToolSetup) -> dict[str, str | int | list[str]]:
    """The tools offered, in GenAI terms where the conventions have one (`gen_ai.tool.*`
    describes one tool: set for a named function, the only one the model may call)."""
    attributes: dict[str, str | int | list[str]] = {
        "sluicegate.tool_choice": tools.mode,
        "sluicegate.tools.count": len(tools.tools),
        "sluicegate.tools.names": list(tools.names),
    }
    if tools.function is not None:
        attributes["gen_ai.tool.name"] = tools.function
        attributes["gen_ai.tool.type"] = "function"
    return attributes


class GenerationTelemetry:
    """Use as `with GenerationTelemetry(...) as telemetry:` around the run's steps, calling
    `telemetry.step(prompt_index, step)` for each.

    `operation` is the GenAI operation name: `chat` or `text_completion`. Prompt tokens count
    once the engine has answered (a run refused before its first step processed nothing);
    completion tokens count as they come, those of aborted runs included."""

    __slots__ = (
        "_answered",
        "_completion_tokens",
        "_finish_reasons",
        "_first_token",
        "_last_token",
        "_prompt_tokens",
        "_record",
        "_series",
        "_span",
        "_started",
        "_traffic",
    )

    def __init__(
        self,
        operation: str,
        model: str,
        response_id: str,
        prompt_tokens: int,
        options: SamplingOptions,
        tools: ToolSetup | None = None,
    ):
        self._series = _series(model)
        self._record: RequestRecord | None = current_request()
        self._traffic: TrafficEntry | None = self._record.traffic if self._record else None
        # TTFT as the client sees it: from the request's arrival when there is one.
        self._started = self._record.started if self._record else time.perf_counter()
        self._prompt_tokens = prompt_tokens
        self._answered = False
        self._completion_tokens = 0
        self._first_token: float | None = None
        self._last_token: dict[int, float] = {}
        self._finish_reasons: list[str] = []
        if self._record is not None and self._record.handed is None:
            self._record.handed = time.perf_counter()
        self._span: Span = tracer.start_span(f"{operation} {model}", kind=SpanKind.INTERNAL)
        if self._span.is_recording():
            self._span.set_attributes(
                {
                    "gen_ai.operation.name": operation,
                    "gen_ai.request.model": model,
                    "gen_ai.response.model": model,
                    "gen_ai.response.id": response_id,
                    "gen_ai.request.max_tokens": options.max_tokens,
                    "gen_ai.request.temperature": options.temperature,
                    "gen_ai.request.top_p": options.top_p,
                    "gen_ai.request.choice.count": options.n,
                    "gen_ai.output.type": output_type(options),
                    "gen_ai.usage.input_tokens": prompt_tokens,
                }
            )
            if tools is not None and tools.tools:
                self._span.set_attributes(tool_attributes(tools))

    def __enter__(self) -> GenerationTelemetry:
        return self

    def step(self, prompt_index: int, step: EngineStep) -> bool:
        """Account for one engine step of the prompt at `prompt_index` of the run; whether
        it brought the run's first token."""
        self._answered = True
        tokens = 0
        traffic = self._traffic
        for delta in step.choices:
            self._completion_tokens += delta.num_tokens
            tokens = max(tokens, delta.num_tokens)
            if delta.finish_reason is not None:
                self._finish_reasons.append(delta.finish_reason)
            if traffic is not None:
                traffic.add(prompt_index, delta.index, delta.num_tokens, delta.finish_reason)
        if not tokens:
            return False
        now = time.perf_counter()
        first = self._first_token is None
        if first:
            self._first_token = now
            self._series.ttft.observe(now - self._started)
            record = self._record
            if record is not None:
                record.first_token = now
                if (times := step.times) is not None:
                    record.queued = times.queued
                    record.scheduled = times.scheduled
                    record.engine_first_token = times.first_token
            self._span.add_event("first_token")
        last = self._last_token.get(prompt_index)
        if last is not None:
            # One observation per step, as vLLM's own histogram: a step that carries several
            # tokens (an upstream's coalesced events) gives their mean gap.
            gap = (now - last) / tokens
            self._series.itl.observe(gap)
            record = self._record
            if record is not None and record.slow_gap is not None:
                record.gaps += 1
                record.slow_gaps += gap > record.slow_gap
        self._last_token[prompt_index] = now
        return first

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        prompt_tokens = self._prompt_tokens if self._answered else 0
        self._series.prompt_tokens.inc(prompt_tokens)
        self._series.completion_tokens.inc(self._completion_tokens)
        if self._record is not None:
            self._record.engine_finished = time.perf_counter()
            if self._answered:
                self._record.add_usage(prompt_tokens, self._completion_tokens)
        span = self._span
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.usage.output_tokens": self._completion_tokens,
                    "gen_ai.response.finish_reasons": self._finish_reasons,
                }
            )
            if exc_type is GeneratorExit or isinstance(exc, asyncio.CancelledError):
                # The consumer stopped reading (client gone, time limit): the run was aborted.
                span.set_attribute("sluicegate.aborted", True)
            elif exc is not None:
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
        span.end()
