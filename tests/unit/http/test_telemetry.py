"""Request metrics, engine-run metrics and the access log, over the app with the fake engine."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.errors import EngineUnavailableError
from sluicegate.lifecycle import Lifecycle
from sluicegate.observability.logs import JsonFormatter, PlainFormatter
from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, fake_app, serve_in_thread
from tests.support.metrics import local_value

CHAT = "/v1/chat/completions"
KEY = "sk-telemetry-0123456789"


def requests_total(endpoint: str, status: str, model: str = FAKE_MODEL) -> float:
    return local_value("sluicegate_requests_total", endpoint=endpoint, model=model, status=status)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(fake_app(engine)) as test_client:
        yield test_client


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_request_counts_by_route_model_and_status(client: TestClient) -> None:
    before = requests_total(CHAT, "200")
    durations = local_value(
        "sluicegate_request_duration_seconds_count", endpoint=CHAT, model=FAKE_MODEL
    )
    assert client.post(CHAT, json=chat_body()).status_code == 200
    assert requests_total(CHAT, "200") == before + 1
    assert (
        local_value("sluicegate_request_duration_seconds_count", endpoint=CHAT, model=FAKE_MODEL)
        == durations + 1
    )


@pytest.mark.parametrize("stream", [False, True])
def test_token_counters_equal_the_usage_returned(client: TestClient, stream: bool) -> None:
    prompt = local_value("sluicegate_prompt_tokens_total", model=FAKE_MODEL)
    completion = local_value("sluicegate_completion_tokens_total", model=FAKE_MODEL)
    body = chat_body(n=2, stream=stream, stream_options={"include_usage": True} if stream else None)
    response = client.post(CHAT, json=body)
    if stream:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
        usage = json.loads(events[-1])["usage"]
    else:
        usage = response.json()["usage"]
    assert usage["completion_tokens"] == 6  # two choices of three tokens
    assert local_value("sluicegate_prompt_tokens_total", model=FAKE_MODEL) == (
        prompt + usage["prompt_tokens"]
    )
    assert local_value("sluicegate_completion_tokens_total", model=FAKE_MODEL) == (
        completion + usage["completion_tokens"]
    )


def test_a_run_the_engine_refused_counts_no_tokens(engine: FakeEngine) -> None:
    engine.fail_before_output = EngineUnavailableError()
    prompt = local_value("sluicegate_prompt_tokens_total", model=FAKE_MODEL)
    with TestClient(fake_app(engine)) as client:
        assert client.post(CHAT, json=chat_body()).status_code == 503
    assert local_value("sluicegate_prompt_tokens_total", model=FAKE_MODEL) == prompt


def test_ttft_and_inter_token_latency_are_observed(engine: FakeEngine) -> None:
    engine.delays = [0.05, 0.03, 0.03]
    ttft_count = local_value("sluicegate_time_to_first_token_seconds_count", model=FAKE_MODEL)
    ttft_sum = local_value("sluicegate_time_to_first_token_seconds_sum", model=FAKE_MODEL)
    itl_count = local_value("sluicegate_inter_token_latency_seconds_count", model=FAKE_MODEL)
    itl_sum = local_value("sluicegate_inter_token_latency_seconds_sum", model=FAKE_MODEL)
    with TestClient(fake_app(engine)) as client:
        client.post(CHAT, json=chat_body(stream=True))
    assert local_value("sluicegate_time_to_first_token_seconds_count", model=FAKE_MODEL) == (
        ttft_count + 1
    )
    assert local_value("sluicegate_time_to_first_token_seconds_sum", model=FAKE_MODEL) >= (
        ttft_sum + 0.05
    )
    # Three tokens, two gaps between them.
    assert local_value("sluicegate_inter_token_latency_seconds_count", model=FAKE_MODEL) == (
        itl_count + 2
    )
    assert local_value("sluicegate_inter_token_latency_seconds_sum", model=FAKE_MODEL) >= (
        itl_sum + 0.06
    )


@pytest.mark.parametrize("stream", [True, False])
def test_the_overhead_header_and_histogram_leave_out_the_engines_time(
    engine: FakeEngine, stream: bool
) -> None:
    """The engine holds the first token 0.5 s (and the last, in all, 0.7 s): the gateway's
    own time is what is left of the time to the response's start once that is taken out."""
    engine.delays = [0.5, 0.1, 0.1]
    count = local_value("sluicegate_gateway_overhead_seconds_count", model=FAKE_MODEL)
    total = local_value("sluicegate_gateway_overhead_seconds_sum", model=FAKE_MODEL)
    with TestClient(fake_app(engine)) as client:
        started = time.perf_counter()
        with client.stream("POST", CHAT, json=chat_body(stream=stream)) as response:
            elapsed = time.perf_counter() - started  # the headers are in
            assert response.status_code == 200
            header = float(response.headers["x-sluicegate-overhead-duration-ms"])
            response.read()
    engine_part = 0.5 if stream else 0.7
    assert 0 <= header <= (elapsed - engine_part) * 1000, (header, elapsed)
    assert local_value("sluicegate_gateway_overhead_seconds_count", model=FAKE_MODEL) == count + 1
    observed = local_value("sluicegate_gateway_overhead_seconds_sum", model=FAKE_MODEL) - total
    assert observed == pytest.approx(header / 1000, abs=0.0006)


def test_off_the_inference_routes_there_is_no_overhead_header(client: TestClient) -> None:
    assert "x-sluicegate-overhead-duration-ms" not in client.get("/v1/models").headers


def test_endpoint_is_the_route_template_and_unknown_paths_share_one_label(
    client: TestClient,
) -> None:
    template = next(
        r.path  # type: ignore[attr-defined]
        for r in client.app.routes  # type: ignore[attr-defined]
        if getattr(r, "path", "").startswith("/v1/models/")
    )
    before = requests_total(template, "200", model="")
    unknown = requests_total("unmatched", "404", model="")
    client.get(f"/v1/models/{FAKE_MODEL}")
    client.get("/no/such/path/12345")
    assert requests_total(template, "200", model="") == before + 1
    assert requests_total("unmatched", "404", model="") == unknown + 1
    # No label anywhere holds the concrete path (the numbers of the exposition, such as
    # `_created` timestamps, may hold any digits).
    labels = [
        value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for metric_sample in family.samples
        for value in metric_sample.labels.values()
    ]
    assert template in labels
    assert not [v for v in labels if "12345" in v or f"/v1/models/{FAKE_MODEL}" in v]


def test_refusals_by_middleware_count_on_their_route_and_by_error_code() -> None:
    """Refused before routing, the request names no model of the registry: its `model` label
    is empty (what the client typed never becomes a label)."""
    errors = local_value(
        "sluicegate_errors_total", type="invalid_request_error", code="invalid_api_key"
    )
    before = requests_total(CHAT, "401", model="")
    with TestClient(fake_app(api_keys=KEY)) as client:
        assert client.post(CHAT, json=chat_body()).status_code == 401
    assert requests_total(CHAT, "401", model="") == before + 1
    assert (
        local_value("sluicegate_errors_total", type="invalid_request_error", code="invalid_api_key")
        == errors + 1
    )


def test_admission_refusals_are_counted_by_reason() -> None:
    lifecycle = Lifecycle(drain_timeout=1)
    before = local_value("sluicegate_admission_refused_total", reason="shutting_down")
    with TestClient(fake_app(lifecycle=lifecycle)) as client:
        lifecycle.begin_drain()
        assert client.post(CHAT, json=chat_body()).status_code == 503
    assert local_value("sluicegate_admission_refused_total", reason="shutting_down") == before + 1


def test_an_error_inside_a_started_stream_is_counted(engine: FakeEngine) -> None:
    engine.fail_after_words = 1
    labels = {"type": "service_unavailable_error", "code": "engine_unavailable"}
    before = local_value("sluicegate_errors_total", **labels)
    with TestClient(fake_app(engine)) as client:
        response = client.post(CHAT, json=chat_body(stream=True))
    assert response.status_code == 200 and '"engine_unavailable"' in response.text
    assert local_value("sluicegate_errors_total", **labels) == before + 1


def test_errors_before_output_are_counted_by_type(engine: FakeEngine) -> None:
    engine.fail_before_output = EngineUnavailableError()
    labels = {"type": "service_unavailable_error", "code": "engine_unavailable"}
    before = local_value("sluicegate_errors_total", **labels)
    with TestClient(fake_app(engine)) as client:
        assert client.post(CHAT, json=chat_body()).status_code == 503
        assert client.post(CHAT, json={"model": FAKE_MODEL}).status_code == 400
    assert local_value("sluicegate_errors_total", **labels) == before + 1


def test_a_client_leaving_mid_stream_counts_as_499_and_a_disconnect() -> None:
    engine = FakeEngine(words=["tok"] * 200, step_delay=0.02)
    disconnects = local_value(
        "sluicegate_client_disconnects_total", endpoint=CHAT, model=FAKE_MODEL
    )
    closed = requests_total(CHAT, "499")
    in_flight = "sluicegate_requests_in_flight"
    with serve_in_thread(fake_app(engine)) as url, httpx.Client(base_url=url) as http:
        with http.stream("POST", CHAT, json=chat_body(stream=True)) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert local_value(in_flight, model=FAKE_MODEL) == 1
            assert engine.active
        wait_for(lambda: requests_total(CHAT, "499") == closed + 1)
        assert local_value(in_flight, model=FAKE_MODEL) == 0
        assert not engine.active  # the engine run was aborted
    assert (
        local_value("sluicegate_client_disconnects_total", endpoint=CHAT, model=FAKE_MODEL)
        == disconnects + 1
    )


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sluicegate.access"]


def test_one_access_line_per_request_with_ids_tokens_and_timings(
    caplog: pytest.LogCaptureFixture, engine: FakeEngine
) -> None:
    engine.delays = [0.02, 0.01, 0.01]
    caplog.set_level(logging.INFO, logger="sluicegate.access")
    secret_prompt = "my-secret-prompt-words"
    with TestClient(fake_app(engine, api_keys=KEY)) as client:
        response = client.post(
            CHAT,
            json=chat_body(messages=[{"role": "user", "content": secret_prompt}]),
            headers={"authorization": f"Bearer {KEY}", "x-request-id": "req-telemetry-1"},
        )
    assert response.status_code == 200
    (record,) = access_records(caplog)
    fields = record.fields  # type: ignore[attr-defined]
    usage = response.json()["usage"]
    assert record.getMessage() == f"POST {CHAT}"
    assert fields["request_id"] == "req-telemetry-1"
    assert fields["status"] == 200 and fields["model"] == FAKE_MODEL
    assert fields["prompt_tokens"] == usage["prompt_tokens"]
    assert fields["completion_tokens"] == usage["completion_tokens"]
    assert 20 <= fields["ttft_ms"] <= fields["total_ms"]
    assert fields["cache"] == response.headers.get("x-cache")
    assert "trace_id" in fields
    for formatter in (PlainFormatter(), JsonFormatter()):
        line = formatter.format(record)
        assert KEY not in line and secret_prompt not in line


def test_a_clients_slow_upload_is_its_own_not_the_gateways(
    caplog: pytest.LogCaptureFixture, engine: FakeEngine
) -> None:
    """A client that sends its headers and then, two seconds later, its body: the access
    line's `body_wait_ms` holds that wait, and the overhead header leaves it out (it held
    the whole pause when it ran from the headers)."""
    caplog.set_level(logging.INFO, logger="sluicegate.access")
    body = json.dumps(chat_body()).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with serve_in_thread(fake_app(engine)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head)
            time.sleep(2.0)
            sock.sendall(body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        wait_for(lambda: access_records(caplog))
    head_lines = answer.split(b"\r\n\r\n", 1)[0].decode().lower().splitlines()
    assert head_lines[0].endswith("200 ok"), head_lines[0]
    (overhead_line,) = [h for h in head_lines if h.startswith("x-sluicegate-overhead")]
    fields = access_records(caplog)[0].fields  # type: ignore[attr-defined]
    overhead = float(overhead_line.split(":")[1])
    # The pause is counted as the client's wait, and the overhead leaves that wait out (an
    # account, not a bound: it holds however loaded the machine is; the access line rounds
    # to a tenth of a millisecond). Counted from the headers, the overhead held the pause.
    assert 0 < fields["body_wait_ms"] <= fields["total_ms"], fields
    assert overhead <= fields["total_ms"] - fields["body_wait_ms"] + 0.2, (overhead, fields)


def test_probes_log_at_debug_and_requests_at_info(
    caplog: pytest.LogCaptureFixture, client: TestClient
) -> None:
    caplog.set_level(logging.DEBUG, logger="sluicegate.access")
    client.get("/health")
    client.get("/v1/models")
    levels = {r.getMessage(): r.levelno for r in access_records(caplog)}
    assert levels == {"GET /health": logging.DEBUG, "GET /v1/models": logging.INFO}


def make_record(**fields: object) -> logging.LogRecord:
    record = logging.LogRecord("sluicegate.access", logging.INFO, __file__, 1, "GET /x", (), None)
    record.fields = fields
    return record


def test_plain_format_appends_fields_as_key_value_pairs() -> None:
    line = PlainFormatter().format(make_record(status=200, request_id="abc", ttft_ms=None))
    assert line.endswith("INFO sluicegate.access: GET /x status=200 request_id=abc ttft_ms=-")


def test_json_format_is_one_object_per_line_with_the_fields() -> None:
    line = JsonFormatter().format(make_record(status=200, request_id="abc", ttft_ms=None))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "GET /x" and entry["logger"] == "sluicegate.access"
    assert (entry["status"], entry["request_id"], entry["ttft_ms"]) == (200, "abc", None)
    assert entry["level"] == "INFO" and entry["time"].endswith("+00:00")
