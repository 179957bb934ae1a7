"""A real uvicorn server on loopback, serving the app over the fake engine.

Fuzzing targets the gateway's own parsing and validation, so the engine is the fake: each
case takes milliseconds instead of a generation.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

MODEL = FAKE_MODEL


@pytest.fixture(scope="session")
def fake_gateway() -> Iterator[str]:
    app = fake_app(FakeEngine(max_model_len=4096), max_request_bytes=2 * 1024 * 1024)
    with serve_in_thread(app) as url:
        yield url
