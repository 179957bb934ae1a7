"""Engine death and graceful shutdown, each on a gateway of its own."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil

from tests.integration.server import MODEL_NAME, start_gateway

STREAM_BODY = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 48,
    "ignore_eos": True,
    "stream": True,
}


def test_engine_death_gives_503s_and_an_unready_gateway(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path)
    try:
        children = psutil.Process(gateway.process.pid).children(recursive=True)
        assert children, "the engine core runs in a child process"
        for child in children:
            child.kill()

        deadline = time.monotonic() + 30
        while httpx.get(f"{gateway.url}/ready", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/ready still 200 after the engine died"
            time.sleep(0.2)
        ready = httpx.get(f"{gateway.url}/ready", timeout=5).json()
        assert ready["error"]["code"] == "engine_unavailable"
        assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200

        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
        for body in (chat, {**chat, "stream": True}):
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "engine_unavailable"
        completion = {"model": MODEL_NAME, "prompt": "hi"}
        response = httpx.post(f"{gateway.url}/v1/completions", json=completion, timeout=10)
        assert response.status_code == 503
    finally:
        gateway.stop()


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path, "--shutdown-timeout", "60")
    events: list[str] = []
    started = threading.Event()

    def consume() -> None:
        with httpx.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=STREAM_BODY, timeout=120
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    started.set()

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        assert started.wait(60), "the stream did not start"
        gateway.process.send_signal(signal.SIGTERM)
        reader.join(120)
        assert not reader.is_alive()
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
        assert len(content) >= 40  # ~48 tokens; a few may arrive merged in one delta
        assert gateway.process.wait(60) == 0
    finally:
        gateway.stop()
