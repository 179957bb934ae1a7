"""/metrics with the real engine: our series move with real requests, beside vLLM's own."""

from __future__ import annotations

import json
import time

import httpx

from tests.support.gateway import GatewayProcess
from tests.support.metrics import scrape, value

ENGINE_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket",
)


def test_engine_series_are_in_the_gateway_exposition(gateway: GatewayProcess) -> None:
    names = {name for name, _ in scrape(gateway.url)}
    assert set(ENGINE_SERIES) <= names
    assert "sluicegate_requests_in_flight" in names


def test_token_counters_equal_the_usage_returned_to_clients(
    gateway: GatewayProcess, model: str
) -> None:
    before = scrape(gateway.url)
    chat = f"{gateway.url}/v1/chat/completions"
    # temperature > 0: the response cache stays out of it; every request is a generation.
    bodies = [
        {
            "model": model,
            "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 12,
            "temperature": 0.8,
        },
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 9,
            "temperature": 0.8,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ]
    completion = {
        "model": model,
        "prompt": ["The sky is", "Water is"],
        "max_tokens": 7,
        "temperature": 0.8,
    }
    usages = []
    with httpx.Client(timeout=120) as http:
        for body in bodies:
            response = http.post(chat, json=body)
            assert response.status_code == 200
            if body.get("stream"):
                events = [line[6:] for line in response.text.splitlines() if line[:7] == "data: {"]
                usages.append(json.loads(events[-1])["usage"])
            else:
                usages.append(response.json()["usage"])
        response = http.post(f"{gateway.url}/v1/completions", json=completion)
        assert response.status_code == 200
        usages.append(response.json()["usage"])
    after = scrape(gateway.url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("sluicegate_prompt_tokens_total", model=model) == sum(
        u["prompt_tokens"] for u in usages
    )
    assert moved("sluicegate_completion_tokens_total", model=model) == sum(
        u["completion_tokens"] for u in usages
    )
    for endpoint, count in (("/v1/chat/completions", 2), ("/v1/completions", 1)):
        labels = {"endpoint": endpoint, "model": model}
        assert moved("sluicegate_requests_total", status="200", **labels) == count
        assert moved("sluicegate_request_duration_seconds_count", **labels) == count
    # One first token per generation; the batch of two prompts is one request.
    assert moved("sluicegate_time_to_first_token_seconds_count", model=model) == 3
    assert moved("sluicegate_inter_token_latency_seconds_count", model=model) > 0
    assert value(after, "sluicegate_requests_in_flight", model=model) == 0


def test_a_dropped_stream_counts_as_a_client_disconnect(
    gateway: GatewayProcess, model: str
) -> None:
    labels = {"endpoint": "/v1/chat/completions", "model": model}
    before = value(scrape(gateway.url), "sluicegate_client_disconnects_total", **labels)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(gateway.url)
        if value(samples, "sluicegate_client_disconnects_total", **labels) == before + 1:
            break
        assert time.monotonic() < deadline, "the disconnect was not counted"
        time.sleep(0.1)
    assert value(samples, "sluicegate_requests_in_flight", model=model) == 0


PHASES = ("prepare", "wait", "hand_off", "queue", "prefill", "deliver", "write")


def test_a_generation_has_every_phase_of_its_timeline_and_they_add_up(
    gateway: GatewayProcess, model: str
) -> None:
    """The engine's own times (vLLM's request stats) fill the middle of the timeline: one
    streamed request observes every phase once, and the phases add up to what the client
    waited for its first byte, give or take the loopback and the client's own scheduling.
    The prompt is long enough (about 600 tokens) that its prefill, not a pause of this busy
    test process (0.2 s once, beside the other lane), sets what the client waits."""
    before = scrape(gateway.url)
    facts = " ".join(f"Fact {i}: the colour of box {i} is not yet known." for i in range(50))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{facts} Name a colour."}],
        "max_tokens": 8,
        "temperature": 0.8,
        "stream": True,
    }
    started = time.perf_counter()
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        next(chunks)
        first_byte = time.perf_counter() - started
        for _ in chunks:
            pass
    after = scrape(gateway.url)
    seconds = {}
    for phase in PHASES:
        labels = {"model": model, "phase": phase}
        name = "sluicegate_request_phase_seconds"
        count = value(after, f"{name}_count", **labels) - value(before, f"{name}_count", **labels)
        assert count == 1, (phase, count)
        seconds[phase] = value(after, f"{name}_sum", **labels) - value(
            before, f"{name}_sum", **labels
        )
    # The engine's own prefill time is in (how long it takes is no test's business).
    assert seconds["prefill"] > 0, seconds
    total = sum(seconds.values())
    assert total <= first_byte, (seconds, first_byte)
    assert total > 0.5 * first_byte, (seconds, first_byte)
