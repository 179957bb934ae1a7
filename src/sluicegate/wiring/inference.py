"""Inference: each model's request limits, token budget and admission state, and timeouts."""

from __future__ import annotations

from sluicegate.engine.protocol import EngineClient
from sluicegate.http.state import Timeouts
from sluicegate.inference.admission import Admission
from sluicegate.inference.budget import BudgetPolicy
from sluicegate.inference.run import RequestLimits
from sluicegate.inference.service import CompletionService
from sluicegate.inference.structured import StructuredLimits
from sluicegate.models.registry import ServiceFactory
from sluicegate.settings import Settings
from sluicegate.wire.admission import AdmissionBounds
from sluicegate.wire.tools import ToolLimits


def request_limits(settings: Settings) -> RequestLimits:
    return RequestLimits(
        max_messages=settings.max_messages,
        max_prompts=settings.max_prompts,
        max_n=settings.max_n,
        max_tokens=settings.max_tokens_limit,
        max_stop_sequences=settings.max_stop_sequences,
        max_stop_length=settings.max_stop_length,
        max_sequences=settings.max_sequences_per_request,
        tools=ToolLimits(settings.max_tools, settings.max_tools_bytes),
    )


def admission(settings: Settings) -> Admission:
    """The admission bounds at start (`ALLOW_RUNTIME_ADMISSION` lets an admin change them)."""
    return Admission(
        AdmissionBounds(
            ttft_objective=settings.ttft_objective,
            max_engine_waiting=settings.max_engine_waiting,
            max_engine_running=settings.max_engine_running,
            max_kv_cache_usage=settings.max_kv_cache_usage,
        )
    )


def structured_limits(settings: Settings) -> StructuredLimits:
    return StructuredLimits(
        max_schema_bytes=settings.max_schema_bytes,
        max_schema_depth=settings.max_schema_depth,
        max_regex_length=settings.max_regex_length,
        max_grammar_bytes=settings.max_grammar_bytes,
        max_choices=settings.max_choices,
        max_choice_length=settings.max_choice_length,
        compact_whitespace=settings.structured_compact_whitespace,
    )


def budget_policy(settings: Settings) -> BudgetPolicy:
    default_max = settings.budget_default_max_tokens
    if settings.max_tokens_limit is not None:
        default_max = min(default_max, settings.max_tokens_limit)
    return BudgetPolicy(
        reserve_ratio=settings.budget_reserve_ratio,
        default_max_tokens=default_max,
        min_completion_tokens=settings.budget_min_completion_tokens,
        overflow=settings.max_tokens_overflow,
        chat_truncation=settings.truncation,
        completion_truncation=settings.completion_truncation,
    )


def timeouts(settings: Settings) -> Timeouts:
    return Timeouts(
        request=settings.request_timeout,
        stream_stall=settings.stream_stall_timeout,
        ping_after=settings.stream_ping_after,
        keepalive=settings.stream_keepalive_interval,
    )


def service_factory(settings: Settings, bounds: Admission | None = None) -> ServiceFactory:
    """Builds each served model's service. The admission state that models an engine's queue
    and load is one per engine, shared by its models, under the process's `bounds` (the
    settings' unless given)."""
    shared = bounds or admission(settings)

    def build(
        engine: EngineClient, name: str, identity: str, adapter: str | None
    ) -> CompletionService:
        return CompletionService(
            engine,
            name,
            request_limits(settings),
            budget_policy(settings),
            structured_limits(settings),
            shared.of(engine),
            identity=identity,
            adapter=adapter,
        )

    return build
