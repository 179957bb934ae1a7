"""Spans, captured with the SDK's in-memory exporter, over the app with the fake engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sluicegate.errors import EngineUnavailableError
from sluicegate.observability.tracing import Tracing, span_exporters, tracing_requested
from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, fake_app, serve_in_thread

CHAT = "/v1/chat/completions"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture(scope="module")
def provider() -> TracerProvider:
    # OpenTelemetry has one global provider per process; the app installs this one.
    return TracerProvider()


@pytest.fixture(scope="module")
def exporter(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(
    engine: FakeEngine, provider: TracerProvider, spans: InMemorySpanExporter
) -> Iterator[TestClient]:
    with TestClient(fake_app(engine, tracer_provider=provider)) as test_client:
        yield test_client


def by_name(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = spans.get_finished_spans()
    named = {s.name: s for s in finished}
    assert len(named) == len(finished), [s.name for s in finished]
    return named


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_request_span_continues_traceparent_and_parents_budget_and_generation(
    client: TestClient, spans: InMemorySpanExporter
) -> None:
    response = client.post(CHAT, json=chat_body(), headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    named = by_name(spans)
    server = named[f"POST {CHAT}"]
    budget = named["token_budget"]
    generation = named[f"chat {FAKE_MODEL}"]
    assert server.kind is SpanKind.SERVER
    assert {format(s.context.trace_id, "032x") for s in named.values()} == {TRACE_ID}
    assert server.parent is not None and server.parent.is_remote
    assert parent_id(server) == int(PARENT_ID, 16)
    assert parent_id(budget) == server.context.span_id
    assert parent_id(generation) == server.context.span_id
    assert budget.end_time <= generation.start_time  # type: ignore[operator]


def test_generation_span_has_genai_attributes_and_a_first_token_event(
    client: TestClient, spans: InMemorySpanExporter
) -> None:
    body = chat_body(max_tokens=7, temperature=0.5, n=2)
    usage = client.post(CHAT, json=body).json()["usage"]
    generation = by_name(spans)[f"chat {FAKE_MODEL}"]
    attributes = dict(generation.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == FAKE_MODEL
    assert attributes["gen_ai.request.max_tokens"] == 7
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.request.choice.count"] == 2
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attributes["gen_ai.response.finish_reasons"] == ("stop", "stop")
    assert attributes["gen_ai.output.type"] == "text"
    assert str(attributes["gen_ai.response.id"]).startswith("chatcmpl-")
    (event,) = generation.events
    assert event.name == "first_token"
    assert generation.start_time <= event.timestamp <= generation.end_time  # type: ignore[operator]
    assert generation.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize(
    ("extra", "output_type"),
    [
        ({"response_format": {"type": "json_object"}}, "json"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "json"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "text"),
    ],
)
def test_generation_span_names_the_output_type(
    client: TestClient, spans: InMemorySpanExporter, extra: dict[str, Any], output_type: str
) -> None:
    assert client.post(CHAT, json=chat_body(**extra)).status_code == 200
    generation = by_name(spans)[f"chat {FAKE_MODEL}"]
    assert dict(generation.attributes or {})["gen_ai.output.type"] == output_type


def test_text_completion_streams_get_a_text_completion_span(
    client: TestClient, spans: InMemorySpanExporter
) -> None:
    body = {"model": FAKE_MODEL, "prompt": "one two", "stream": True, "max_tokens": 2}
    assert "[DONE]" in client.post("/v1/completions", json=body).text
    generation = by_name(spans)[f"text_completion {FAKE_MODEL}"]
    assert generation.attributes is not None
    assert generation.attributes["gen_ai.usage.output_tokens"] == 2
    assert generation.attributes["gen_ai.response.finish_reasons"] == ("length",)


def test_engine_failure_marks_the_generation_span_as_an_error(
    client: TestClient, engine: FakeEngine, spans: InMemorySpanExporter
) -> None:
    engine.fail_after_words = 1
    client.post(CHAT, json=chat_body())
    generation = by_name(spans)[f"chat {FAKE_MODEL}"]
    assert generation.status.status_code is StatusCode.ERROR
    assert generation.attributes is not None
    assert generation.attributes["error.type"] == EngineUnavailableError.__qualname__


def test_a_client_leaving_marks_the_generation_span_aborted(
    provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    engine = FakeEngine(words=["tok"] * 200, step_delay=0.02)
    with serve_in_thread(fake_app(engine, tracer_provider=provider)) as url:
        with httpx.stream("POST", f"{url}{CHAT}", json=chat_body(stream=True)) as response:
            lines = response.iter_lines()
            next(lines)
        deadline = time.monotonic() + 5
        while not any(s.name.startswith("chat ") for s in spans.get_finished_spans()):
            assert time.monotonic() < deadline, "no generation span"
            time.sleep(0.02)
    generation = by_name(spans)[f"chat {FAKE_MODEL}"]
    assert generation.attributes is not None
    assert generation.attributes["sluicegate.aborted"] is True
    assert generation.status.status_code is StatusCode.UNSET


def test_probes_and_scrapes_are_not_traced(client: TestClient, spans: InMemorySpanExporter) -> None:
    for path in ("/health", "/ready", "/metrics"):
        client.get(path)
    client.get("/v1/models")
    assert [s.name for s in spans.get_finished_spans()] == ["GET /v1/models"]


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_off_unless_the_otel_environment_asks(
    environ: dict[str, str], wanted: bool
) -> None:
    assert tracing_requested(environ) is wanted
    assert (Tracing.from_env(environ) is not None) is wanted


@pytest.mark.parametrize(
    ("environ", "kinds"),
    [
        ({}, [HttpSpanExporter]),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [GrpcSpanExporter]),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, [GrpcSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, [HttpSpanExporter, ConsoleSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ],
)
def test_exporters_follow_otel_traces_exporter_and_protocol(
    environ: dict[str, str], kinds: list[type]
) -> None:
    exporters = span_exporters(environ)
    try:
        assert [type(e) for e in exporters] == kinds
    finally:
        for exporter in exporters:
            exporter.shutdown()


def test_an_unknown_exporter_name_is_refused() -> None:
    with pytest.raises(ValueError, match="zipkin-typo"):
        span_exporters({"OTEL_TRACES_EXPORTER": "zipkin-typo"})


def test_service_name_comes_from_otel_service_name() -> None:
    tracing = Tracing.from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "edge"})
    assert tracing is not None and tracing.owned
    assert tracing.provider.resource.attributes["service.name"] == "edge"
    default = Tracing.from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert default is not None
    assert default.provider.resource.attributes["service.name"] == "sluicegate"
