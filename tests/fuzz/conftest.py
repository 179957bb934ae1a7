"""A real uvicorn server on loopback, serving the app over the fake engine.

Fuzzing targets the gateway's own parsing and validation, so the engine is the fake: each
case takes milliseconds instead of a generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from tests.fakes import FAKE_MODEL, FakeEngine, fake_app
from tests.integration.server import free_port

MODEL = FAKE_MODEL


@pytest.fixture(scope="session")
def fake_gateway() -> Iterator[str]:
    app = fake_app(FakeEngine(max_model_len=4096), max_request_bytes=2 * 1024 * 1024)
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="httptools",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fake gateway did not start"
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)
    assert httpx  # imported for the fixtures below
