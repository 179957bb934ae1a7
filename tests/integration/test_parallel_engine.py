"""The real engine split over several tensor-parallel workers on CPU (vLLM's `mp` backend):
answers, aborts, the metrics an endpoint picker reads, and the drain, on one gateway.

Tensor parallelism needs a model whose attention heads divide by the size: the bundled
SmolLM2-135M has 9 heads (3 key-value heads), so 2 is impossible and 3 is the smallest size
above 1. vLLM's automatic CPU binding wants one NUMA node per worker; a machine with one
node gets an explicit binding (`VLLM_CPU_OMP_THREADS_BIND`), the workers taking turns on
the cores this process may use."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway
from tests.support.metrics import metric_value

# Starting three workers on a shared 2-core machine takes minutes, inside the first test's
# time (its fixture).
pytestmark = pytest.mark.timeout(600)

TENSOR_PARALLEL_SIZE = 3
PICKER = Path(__file__).resolve().parents[2] / (
    "deploy/kubernetes/examples/inference-gateway/endpoint-picker.yaml"
)
CHAT = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 12,
}


def thread_binding(workers: int) -> str:
    """One CPU per worker, round robin over the CPUs this process may run on."""
    cpus = sorted(os.sched_getaffinity(0))
    return "|".join(str(cpus[i % len(cpus)]) for i in range(workers))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path_factory.mktemp("parallel"),
        env={
            "SLUICEGATE_TENSOR_PARALLEL_SIZE": str(TENSOR_PARALLEL_SIZE),
            "SLUICEGATE_DISTRIBUTED_EXECUTOR_BACKEND": "mp",
            "SLUICEGATE_CPU_KVCACHE_SPACE_GIB": "1",
            # Room for the drain test's request, however slow a shared machine is.
            "SLUICEGATE_SHUTDOWN_TIMEOUT": "180",
            "VLLM_CPU_OMP_THREADS_BIND": thread_binding(TENSOR_PARALLEL_SIZE),
        },
    ) as process:
        yield process


def workers(gateway: GatewayProcess) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(gateway.process.pid).children(recursive=True):
        try:
            if child.name().startswith("VLLM::Worker") or "VLLM::Worker" in " ".join(
                child.cmdline()
            ):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def picker() -> tuple[str, set[str]]:
    """Where the example endpoint picker scrapes, and the engine metrics it reads there."""
    config_map = next(
        doc for doc in yaml.safe_load_all(PICKER.read_text()) if doc["kind"] == "ConfigMap"
    )
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    plugins = {plugin["type"]: plugin.get("parameters", {}) for plugin in config["plugins"]}
    (engine,) = plugins["core-metrics-extractor"]["engineConfigs"]
    names = {value for key, value in engine.items() if key.endswith("Spec") and value}
    return plugins["metrics-data-source"]["path"], names


def counted(gateway: GatewayProcess, name: str) -> bool:
    return name in series(httpx.get(f"{gateway.url}/metrics", timeout=10).text)


def series(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_the_engine_runs_as_tensor_parallel_workers_and_answers(gateway: GatewayProcess) -> None:
    assert len(workers(gateway)) == TENSOR_PARALLEL_SIZE
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0


def test_it_exports_what_an_endpoint_picker_reads(gateway: GatewayProcess) -> None:
    path, wanted = picker()
    assert {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    } <= wanted
    everything = series(httpx.get(f"{gateway.url}/metrics", timeout=10).text)
    # The LoRA series only while the engine has LoRA on, which this gateway has not
    # (tests/integration/test_vllm_parity.py reads it from a gateway serving adapters).
    assert "vllm:lora_requests_info" not in everything
    wanted -= {"vllm:lora_requests_info"}
    assert wanted <= everything, f"missing: {wanted - everything}"
    # Where the picker scrapes, those series and nothing else.
    assert path == "/metrics/engine"
    engine = httpx.get(f"{gateway.url}{path}", timeout=10)
    assert engine.headers["content-type"].startswith("text/plain")
    assert series(engine.text) == wanted
    assert metric_value(gateway.url, "sluicegate_completion_tokens_total") > 0


def test_a_client_that_leaves_aborts_its_request_in_every_worker(
    gateway: GatewayProcess,
) -> None:
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    disconnects = "sluicegate_client_disconnects_total"
    # The counter's first series appears with the first disconnect.
    before = metric_value(gateway.url, disconnects) if counted(gateway, disconnects) else 0.0
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # the first event: the request runs; then hang up
    assert metric_value(gateway.url, "vllm:num_requests_running") <= 1
    deadline = time.monotonic() + 30
    while metric_value(gateway.url, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the abandoned request still runs"
        time.sleep(0.1)
    assert metric_value(gateway.url, disconnects) == before + 1


def test_sigterm_drains_what_runs_then_stops_every_worker(gateway: GatewayProcess) -> None:
    """Last in this module: it ends the gateway."""
    children = psutil.Process(gateway.process.pid).children(recursive=True)
    engine = [p for p in children if p.name().startswith("VLLM::")]
    assert len(engine) == 1 + TENSOR_PARALLEL_SIZE, [p.name() for p in children]
    tokens = 64
    running = threading.Event()
    reply: dict[str, Any] = {}

    def streamed() -> None:
        body = {
            **CHAT,
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        url = f"{gateway.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=300) as response:
            reply["status"] = response.status_code
            events = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    running.set()  # a token came: the engine runs the request
            reply["events"] = events

    client = threading.Thread(target=streamed)
    client.start()
    assert running.wait(120), "the request did not start"
    # The engine frozen where it is: the request cannot end, so the drain is still on while
    # the checks below run, however fast or loaded the machine (a request that ended first
    # left nothing to drain, and the port closed under the checks). Thawed, it ends.
    for process in engine:
        process.suspend()
    try:
        gateway.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(f"{gateway.url}/ready", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/ready still 200 while draining"
            time.sleep(0.1)
        refused = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
    finally:
        for process in engine:
            process.resume()
    client.join(300)
    assert reply["status"] == 200
    events = reply["events"]
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["usage"]["completion_tokens"] == tokens
    assert gateway.process.wait(120) == 0
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"left running: {[p.pid for p in alive]}"
