"""Inference: each model's request limits, token budget and admission state, and timeouts."""

from __future__ import annotations

import logging

from sluicegate.engine.protocol import EngineClient
from sluicegate.http.state import Timeouts
from sluicegate.inference.budget import BudgetPolicy
from sluicegate.inference.load_limits import LoadLimits
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig
from sluicegate.inference.run import RequestLimits
from sluicegate.inference.service import CompletionService
from sluicegate.inference.structured import StructuredLimits
from sluicegate.models.registry import ServiceFactory
from sluicegate.settings import Settings
from sluicegate.wire.tools import ToolLimits

logger = logging.getLogger(__name__)


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


def load_limits(settings: Settings, engine: EngineClient) -> LoadLimits:
    limits = LoadLimits(
        max_waiting=settings.max_engine_waiting,
        max_running=settings.max_engine_running,
        max_kv_cache_usage=settings.max_kv_cache_usage,
    )
    if limits.any and engine.load() is None:
        logger.warning(
            "MAX_ENGINE_WAITING, MAX_ENGINE_RUNNING and MAX_KV_CACHE_USAGE read the in-process "
            "engine's scheduler; upstreams report none, so they bound nothing here"
        )
    return limits


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


def service_factory(settings: Settings) -> ServiceFactory:
    """Builds each served model's service. The admission state that models an engine's queue
    and load (`PrefillQueue`, `LoadLimits`) is one per engine, shared by its models."""
    per_engine: dict[int, tuple[PrefillQueue, LoadLimits]] = {}

    def build(
        engine: EngineClient, name: str, identity: str, adapter: str | None
    ) -> CompletionService:
        shared = per_engine.get(id(engine))
        if shared is None:
            queue = PrefillQueue(QueueConfig(objective=settings.ttft_objective))
            shared = per_engine[id(engine)] = (queue, load_limits(settings, engine))
        return CompletionService(
            engine,
            name,
            request_limits(settings),
            budget_policy(settings),
            structured_limits(settings),
            shared[0],
            shared[1],
            identity=identity,
            adapter=adapter,
        )

    return build
