"""OpenTelemetry traces: off unless the standard `OTEL_*` environment asks for an exporter.

Spans come from three places: `opentelemetry-instrumentation-fastapi` (one server span per
request, continuing an incoming `traceparent`), the engine-run hook (`observability.generation`)
and the stages that wrap their work in `span(...)`:

    from sluicegate.observability.tracing import span

    with span("cache.lookup", {"sluicegate.cache.policy": policy}) as current:
        ...
        current.set_attribute("sluicegate.cache.outcome", "hit")

`span` is a child of whatever span is current (the request's server span inside a route);
an exception leaving the block is recorded on it. With tracing off it costs a no-op span.
Spans go through OpenTelemetry's global tracer provider, which the app's lifespan installs:
one provider per process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.util.types import AttributeValue

from sluicegate import __version__
from sluicegate.paths import PROBE_PATHS

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

TRACER_NAME = "sluicegate"
# Probes and scrapes would be most of the spans and say nothing.
UNTRACED_URLS = ",".join(f"{path}$" for path in sorted(PROBE_PATHS))
_EXPORTER_GROUP = "opentelemetry_traces_exporter"

tracer = trace.get_tracer(TRACER_NAME, __version__)
"""sluicegate's tracer; a proxy that follows the global provider once the lifespan sets it."""
_NO_SPAN: AbstractContextManager[trace.Span] = nullcontext(trace.INVALID_SPAN)


class _Tracing:
    on = False
    """Whether `Tracing.activate` has set a tracer provider (OpenTelemetry's cannot be unset).
    Kept here because asking OpenTelemetry (`get_tracer_provider`) reads the environment on
    every call until a provider is set: on every stage of every request, with tracing off."""


_TRACING = _Tracing()


def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> AbstractContextManager[trace.Span]:
    """A span around a stage of the request (cache lookup, token budget...), made current.

    Without a tracer provider (tracing off) it is a shared do-nothing context: even a
    non-recording span costs tens of microseconds per stage on the hot path."""
    if not _TRACING.on:
        return _NO_SPAN
    return tracer.start_as_current_span(name, attributes=attributes)


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the `OTEL_*` variables ask for traces: `OTEL_TRACES_EXPORTER` other than
    `none`, or an OTLP endpoint; never with `OTEL_SDK_DISABLED=true`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return any(name.strip() not in ("", "none") for name in exporters.split(","))
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return any(environ.get(name) for name in endpoints)


def span_exporters(environ: Mapping[str, str] = os.environ) -> list[SpanExporter]:
    """The exporters `OTEL_TRACES_EXPORTER` names (default `otlp`), from the installed
    OpenTelemetry exporter entry points. `otlp` uses `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`:
    `http/protobuf` (the specification's default) or `grpc`. Each exporter reads its own
    endpoint, headers and timeout variables."""
    exporters: list[SpanExporter] = []
    for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip()
        if name in ("", "none"):
            continue
        if name == "otlp":
            protocol = (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            )
            name = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
        found = entry_points(group=_EXPORTER_GROUP, name=name)
        if not found:
            raise ValueError(f"OTEL_TRACES_EXPORTER: no span exporter named {name!r} installed")
        exporters.append(next(iter(found)).load()())
    return exporters


@dataclass(frozen=True, slots=True)
class Tracing:
    """The tracer provider of one app, and whether the app built it (from the environment)
    and so owns its exporters, or was handed it (tests, embedding applications)."""

    provider: TracerProvider
    owned: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Tracing | None:
        """A provider for the `OTEL_*` configuration, or None when tracing is off.

        Nothing starts here: the exporters are attached when the lifespan opens."""
        if not tracing_requested(environ):
            return None
        service = environ.get("OTEL_SERVICE_NAME") or TRACER_NAME
        # TracerProvider reads OTEL_TRACES_SAMPLER(_ARG) and Resource.create reads
        # OTEL_RESOURCE_ATTRIBUTES.
        return cls(TracerProvider(resource=Resource.create({"service.name": service})), True)

    def instrument(self, app: FastAPI) -> None:
        """Server spans for every request but probes and scrapes, continuing `traceparent`."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.provider,
            excluded_urls=UNTRACED_URLS,
            # One span per ASGI message would be one per streamed chunk.
            exclude_spans=["receive", "send"],
        )

    @contextmanager
    def activate(self, environ: Mapping[str, str] = os.environ) -> Iterator[None]:
        """Install the provider as OpenTelemetry's global one for the app's lifetime; an owned
        provider gets its exporters here and is flushed and shut down on exit."""
        if self.owned:
            for exporter in span_exporters(environ):
                self.provider.add_span_processor(BatchSpanProcessor(exporter))
            names = environ.get("OTEL_TRACES_EXPORTER", "otlp")
            logger.info("tracing on: spans go to exporter(s) %s", names)
        if trace.get_tracer_provider() is not self.provider:
            trace.set_tracer_provider(self.provider)
        _TRACING.on = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        try:
            yield
        finally:
            if self.owned:
                self.provider.shutdown()
