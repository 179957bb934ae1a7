"""The shipped dashboard and alert rules against a real Prometheus, and traces over OTLP.

A real gateway (real engine) serves a short mixed load: cache misses and hits, streams, an
oversized max_tokens (clamped by the token budget), an over-long conversation (truncated),
an unknown model, dropped streams. A real Prometheus (Debian's package) scrapes it every
second with the shipped alert rules loaded. Then every PromQL expression of the Grafana
dashboard and of the alert rules runs against Prometheus's HTTP API and must return data.
The gateway exports its traces over OTLP/HTTP to a sink in this test, which checks them.

A second gateway, in upstream mode, fronts the first (a real upstream over HTTP) and takes a
share of the load, so that the dashboard's upstream row has data too; Prometheus scrapes both.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import math
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.gateway import MODEL_NAME, GatewayProcess, free_port, running_gateway
from tests.support.monitoring import (
    ALERTS,
    Query,
    alert_rules,
    dashboard_queries,
    operands,
    substitute,
    variable_queries,
)
from tests.support.redis_server import shared_redis_url

LOAD_SECONDS = 25.0
WORKERS = 2
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
SYSTEM_PROMPT = (
    "You are a helpful assistant for a travel agency. Answer in one short sentence, "
    "mention the city by name, stay polite, and never invent prices or schedules. " * 4
)


# ---- an OTLP/HTTP trace sink ---------------------------------------------------------------


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpSink

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.server.spans.extend(scope_spans.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtlpSink(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


# ---- a Prometheus server -------------------------------------------------------------------


@dataclass
class PrometheusServer:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body: dict[str, Any] = response.json()
        return body

    def wait_scraped_after(self, moment: float, within: float = 60.0) -> None:
        """Until every target's last scrape began after `moment` (wall-clock seconds) and
        succeeded (a failed one also writes `up`, as 0, and leaves the target's series stale)."""
        deadline = time.monotonic() + within
        while True:
            began = self.query("min(timestamp(up))")["data"]["result"]
            answered = self.query("min(up)")["data"]["result"]
            if (
                began
                and answered
                and float(began[0]["value"][1]) > moment
                and float(answered[0]["value"][1]) == 1
            ):
                return
            assert time.monotonic() < deadline, f"no scrape after the load in {within:g} s"
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def start_prometheus(workdir: Path, targets: list[str]) -> PrometheusServer:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: run scripts/ensure-prometheus.sh"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "sluicegate",
                "static_configs": [{"targets": targets}],
                # The gateway with managed keys opens /metrics to a scraper's key; the other
                # has no keys and reads none.
                "authorization": {"credentials": SCRAPER},
            }
        ],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    for _ in range(3):
        server = _launch_prometheus(binary, config_path, workdir, free_port())
        if server is not None:
            return server
    raise AssertionError("prometheus did not start: three ports taken in turn")


def _launch_prometheus(
    binary: str, config_path: Path, workdir: Path, port: int
) -> PrometheusServer | None:
    """Prometheus on `port`, ready; None if it stopped because the port was taken meanwhile."""
    log_path = workdir / f"prometheus-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            log_text = log_path.read_text()
            if "address already in use" in log_text:
                return None
            raise AssertionError(log_text[-3000:])
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"prometheus not ready:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)


ADMIN = "sk-monitoring-admin"
SCRAPER = "sk-monitoring-scraper"
BUDGET_TOKENS = 120
"""A few requests' worth: the budgeted key is refused well before the load ends."""

# ---- the load ------------------------------------------------------------------------------


@dataclass
class LoadReport:
    statuses: dict[str, list[int]] = field(default_factory=dict)

    def add(self, kind: str, status: int) -> None:
        self.statuses.setdefault(kind, []).append(status)


async def drive_load(url: str, seconds: float) -> LoadReport:
    report = LoadReport()
    chat, completions = f"{url}/v1/chat/completions", f"{url}/v1/completions"
    questions = ["What is the capital of France?", "What is the capital of Italy?"]
    cities = ["Paris", "Rome", "Lisbon", "Vienna", "Oslo", "Prague", "Dublin", "Madrid"]
    async with httpx.AsyncClient(timeout=180) as http:

        async def post(kind: str, target: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
            response = await http.post(target, json=body, **kw)
            report.add(kind, response.status_code)
            return response

        # Once: a max_tokens far above the context window (the budget clamps it) and a
        # conversation longer than the window (the budget drops its oldest turns).
        await post(
            "clamped",
            completions,
            {
                "model": MODEL_NAME,
                "prompt": "Paris is",
                "max_tokens": 100_000,
                "stop": [".", "\n"],
                "temperature": 0,
            },
        )
        history = [
            {"role": role, "content": f"Turn {i}: tell me about the weather in {city}. " * 20}
            for i, (role, city) in enumerate(
                zip(["user", "assistant"] * 10, cities * 3, strict=False)
            )
        ]
        await post(
            "trimmed",
            chat,
            {
                "model": MODEL_NAME,
                "messages": [*history, {"role": "user", "content": "Thanks!"}],
                "max_tokens": 8,
                "temperature": 0.7,
            },
        )
        await post(
            "traced",
            chat,
            {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "temperature": 0.7,
            },
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"},
        )

        async def worker(index: int) -> None:
            deadline = time.monotonic() + seconds
            turn = 0
            while time.monotonic() < deadline:
                turn += 1
                question = questions[turn % len(questions)]
                await post(
                    "cacheable",
                    chat,
                    {
                        "model": MODEL_NAME,
                        "messages": [{"role": "user", "content": question}],
                        "max_tokens": 8,
                        "temperature": 0,
                    },
                )
                city = cities[(index * 7 + turn) % len(cities)]
                await post(
                    "stream",
                    chat,
                    {
                        "model": MODEL_NAME,
                        "messages": [
                            {"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": f"One sight to see in {city}?"},
                        ],
                        "max_tokens": 12,
                        "temperature": 0.7,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                )
                await post(
                    "unknown_model",
                    chat,
                    {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
                )
                async with http.stream(
                    "POST",
                    chat,
                    json={
                        "model": MODEL_NAME,
                        "max_tokens": 200,
                        "ignore_eos": True,
                        "stream": True,
                        "temperature": 0.7,
                        "messages": [{"role": "user", "content": "Tell me a story."}],
                    },
                ) as dropped:
                    report.add("dropped", dropped.status_code)
                    async for _ in dropped.aiter_lines():
                        break

        await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    return report


async def drive_upstream_load(url: str, seconds: float) -> LoadReport:
    """Through the upstream-mode gateway, which has managed keys: chats, streamed and not,
    one a second, with a key of its own; and with a key whose small budget runs out, so the
    per-key series and the budget's have data."""
    report = LoadReport()
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=180) as http:
        keys = []
        for settings in ({}, {"budget": {"tokens": BUDGET_TOKENS, "period": "day"}}):
            made = await http.post(
                f"{url}/admin/keys", json=settings, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            keys.append({"Authorization": f"Bearer {made.json()['key']}"})
        turn = 0
        while time.monotonic() < deadline:
            turn += 1
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"Count to {turn}."}],
                "max_tokens": 6,
                "temperature": 0.7,
                "stream": turn % 2 == 0,
            }
            response = await http.post(f"{url}/v1/chat/completions", json=body, headers=keys[0])
            report.add("upstream", response.status_code)
            budgeted = await http.post(
                f"{url}/v1/chat/completions", json={**body, "stream": False}, headers=keys[1]
            )
            report.add("budgeted", budgeted.status_code)
            await asyncio.sleep(1)
        # The budgeted key on, until its budget refuses it: a loaded machine once left the
        # load above time for two turns only (a first answer took 27 s), so the key was never
        # refused and the budget's series had no refusal to show.
        for turn in range(20):
            if report.statuses.get("budgeted", [200])[-1] == 429:
                break
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"Count to {turn}."}],
                "max_tokens": 6,
            }
            budgeted = await http.post(f"{url}/v1/chat/completions", json=body, headers=keys[1])
            report.add("budgeted", budgeted.status_code)
    return report


async def drive_both(url: str, upstream_mode_url: str, seconds: float) -> LoadReport:
    report, through_upstream = await asyncio.gather(
        drive_load(url, seconds), drive_upstream_load(upstream_mode_url, seconds)
    )
    report.statuses.update(through_upstream.statuses)
    return report


# ---- fixtures ------------------------------------------------------------------------------


@dataclass
class Monitored:
    gateway: GatewayProcess
    upstream_mode: GatewayProcess
    prometheus: PrometheusServer
    sink: OtlpSink
    load: LoadReport


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    workdir = tmp_path_factory.mktemp("monitoring")
    sink = OtlpSink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    with contextlib.ExitStack() as stack:
        stack.callback(sink.server_close)
        stack.callback(sink.shutdown)  # after the gateways stop: they export as they do
        gateway = stack.enter_context(
            running_gateway(
                workdir,
                env={
                    "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                    "OTEL_BSP_SCHEDULE_DELAY": "200",
                    "NO_PROXY": "127.0.0.1,localhost",
                    # The dashboard's attainment panel: requests judged against an objective.
                    "SLUICEGATE_SLO_TTFT": "30",
                    "SLUICEGATE_SLO_ITL": "5",
                },
            )
        )
        upstream_mode = stack.enter_context(
            running_gateway(
                workdir,
                env={
                    "SLUICEGATE_UPSTREAM_URLS": f"{gateway.url}/v1",
                    "SLUICEGATE_UPSTREAM_HEALTH_INTERVAL": "1",
                    "SLUICEGATE_CACHE_POLICY": "off",
                    # Managed keys, one with a budget (`drive_upstream_load`).
                    "SLUICEGATE_REDIS_URL": shared_redis_url(),
                    "SLUICEGATE_REDIS_KEY_PREFIX": f"monitoring-{uuid.uuid4().hex[:8]}",
                    "SLUICEGATE_MANAGED_KEYS": "true",
                    "SLUICEGATE_ADMIN_API_KEYS": ADMIN,
                    "SLUICEGATE_METRICS_API_KEYS": SCRAPER,
                },
            )
        )
        targets = [f"127.0.0.1:{g.port}" for g in (gateway, upstream_mode)]
        prometheus = start_prometheus(workdir, targets)
        stack.callback(prometheus.stop)
        load = asyncio.run(drive_both(gateway.url, upstream_mode.url, LOAD_SECONDS))
        prometheus.wait_scraped_after(time.time() + 1)  # two more scrapes (1 s apart) at least
        yield Monitored(gateway, upstream_mode, prometheus, sink, load)


# ---- tests ---------------------------------------------------------------------------------


def test_the_load_exercised_every_path(monitored: Monitored) -> None:
    statuses = monitored.load.statuses
    for kind in ("clamped", "trimmed", "traced", "cacheable", "stream", "dropped", "upstream"):
        assert set(statuses[kind]) == {200}, (kind, statuses[kind])
    assert set(statuses["unknown_model"]) == {404}
    # The budgeted key is served, then refused once its budget is used up.
    budgeted = statuses["budgeted"]
    assert budgeted[0] == 200 and budgeted[-1] == 429 and set(budgeted) == {200, 429}


def _check(prometheus: PrometheusServer, query: Query) -> str | None:
    """None when the query returns at least one number, else what went wrong."""
    body = prometheus.query(query.expr)
    if body.get("status") != "success":
        return f"{query.where}: {body.get('error')} in {query.expr}"
    result = body["data"]["result"]
    values = (
        [float(result[1])]
        if body["data"]["resultType"] == "scalar"
        else [float(r["value"][1]) for r in result]
    )
    if not values:
        return f"{query.where}: no data for {query.expr}"
    if all(math.isnan(v) for v in values):
        return f"{query.where}: only NaN for {query.expr}"
    return None


def test_every_dashboard_query_returns_data(monitored: Monitored) -> None:
    variables = {
        "model": MODEL_NAME,
        "instance": "|".join(
            f"127.0.0.1:{g.port}" for g in (monitored.gateway, monitored.upstream_mode)
        ),
        "__rate_interval": "1m",
        "__interval": "15s",
        "__range": "5m",
    }
    queries = [
        Query(q.where, substitute(q.expr, variables))
        for q in [*dashboard_queries(), *variable_queries()]
    ]
    assert len(queries) > 25
    failures = [f for q in queries if (f := _check(monitored.prometheus, q))]
    assert not failures, "\n".join(failures)


def test_every_alert_expression_evaluates_and_its_operands_return_data(
    monitored: Monitored,
) -> None:
    failures = []
    for rule in alert_rules():
        whole = monitored.prometheus.query(rule["expr"])
        if whole.get("status") != "success":
            failures.append(f"{rule['alert']}: {whole.get('error')}")
        for operand in operands(rule["expr"]):
            failure = _check(monitored.prometheus, Query(f"alert {rule['alert']}", operand))
            if failure:
                failures.append(failure)
    assert not failures, "\n".join(failures)
    rules = httpx.get(f"{monitored.prometheus.url}/api/v1/rules", timeout=10).json()
    loaded = [r for g in rules["data"]["groups"] for r in g["rules"]]
    assert len(loaded) == len(alert_rules())
    assert {r["health"] for r in loaded} == {"ok"}, [r.get("lastError") for r in loaded]


def test_cache_hits_budget_clamps_trims_errors_and_disconnects_were_counted(
    monitored: Monitored,
) -> None:
    def total(expr: str) -> float:
        result = monitored.prometheus.query(f"sum({expr})")["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    assert total('sluicegate_cache_requests_total{outcome="hit"}') > 0
    assert total("sluicegate_budget_clamped_max_tokens_total") >= 1
    assert total("sluicegate_budget_trimmed_requests_total") >= 1
    assert total("sluicegate_budget_dropped_tokens_total") > 0
    assert total('sluicegate_errors_total{code="model_not_found"}') > 0
    assert total("sluicegate_client_disconnects_total") > 0
    assert total("vllm:prefix_cache_hits_total") > 0
    assert total('up{job="sluicegate"}') == 2
    assert total('sluicegate_upstream_requests_total{outcome="ok"}') > 0


def _hex(raw: bytes) -> str:
    return raw.hex()


def test_traces_reach_the_otlp_endpoint_with_the_request_structure(monitored: Monitored) -> None:
    deadline = time.monotonic() + 10
    while True:
        spans = monitored.sink.snapshot()
        named = {s.name for s in spans}
        if {f"chat {MODEL_NAME}", "POST /v1/chat/completions", "token_budget"} <= named:
            break
        assert time.monotonic() < deadline, f"spans received: {sorted(named)}"
        time.sleep(0.2)
    traced = [s for s in spans if _hex(s.trace_id) == TRACE_ID]
    by_name = {s.name: s for s in traced}
    server = by_name["POST /v1/chat/completions"]
    generation = by_name[f"chat {MODEL_NAME}"]
    assert _hex(server.parent_span_id) == PARENT_SPAN_ID
    assert generation.parent_span_id == server.span_id
    assert by_name["token_budget"].parent_span_id == server.span_id
    assert by_name["cache.lookup"].parent_span_id == server.span_id
    attributes = {a.key: a.value for a in generation.attributes}
    assert attributes["gen_ai.request.model"].string_value == MODEL_NAME
    assert attributes["gen_ai.request.max_tokens"].int_value == 4
    assert attributes["gen_ai.request.temperature"].double_value == 0.7
    assert attributes["gen_ai.usage.input_tokens"].int_value > 0
    assert 0 < attributes["gen_ai.usage.output_tokens"].int_value <= 4
    reasons = [
        v.string_value for v in attributes["gen_ai.response.finish_reasons"].array_value.values
    ]
    assert reasons and set(reasons) <= {"stop", "length"}
    assert [e.name for e in generation.events] == ["first_token"]
    # No spans for probes and scrapes, and none per streamed chunk.
    assert not [s for s in spans if s.name.startswith(("GET /metrics", "GET /ready"))]
    assert not [s for s in spans if "http send" in s.name]
