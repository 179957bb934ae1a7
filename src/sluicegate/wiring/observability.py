"""Observability: traces, the keys named in metrics, and the event loop's lag watch."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from opentelemetry.sdk.trace import TracerProvider

from sluicegate.observability.key_label import KeyLabels
from sluicegate.observability.loop_lag import watch_loop_lag
from sluicegate.observability.objective import ServiceObjective
from sluicegate.observability.tracing import Tracing
from sluicegate.settings import Settings


def tracing(provider: TracerProvider | None) -> Tracing | None:
    """Traces to `provider` when given, else where the `OTEL_*` environment says (nowhere
    when it says nothing)."""
    return Tracing.from_env() if provider is None else Tracing(provider, False)


def key_labels(settings: Settings) -> KeyLabels:
    """The keys with series of their own in the per-key metrics: the first
    `METRICS_MAX_KEYS` seen; the others are counted as `other`."""
    return KeyLabels(settings.metrics_max_keys)


def watch_loop(stack: AsyncExitStack) -> None:
    """Measure the event loop's lag for as long as `stack` is open."""
    lag_watch = asyncio.create_task(watch_loop_lag())
    stack.callback(lag_watch.cancel)


def service_objective(settings: Settings) -> ServiceObjective | None:
    """The objective requests are judged against (`SLO_TTFT`, `SLO_ITL`), when one is set."""
    if settings.slo_ttft is None:
        return None
    return ServiceObjective(settings.slo_ttft, settings.slo_itl)
