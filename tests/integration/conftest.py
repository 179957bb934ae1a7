from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI, OpenAI

from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One real gateway (real vLLM engine, SmolLM2, float32) for the whole session."""
    with running_gateway(tmp_path_factory.mktemp("gateway")) as process:
        yield process


# Points the tests that take `base_url` (not `gateway`) at a server already running, e.g. vLLM's
# own OpenAI server on the same model, to check the tests themselves (docs/testing.md).
EXTERNAL_BASE_URL = "GATEWAY_TEST_BASE_URL"


@pytest.fixture(scope="session")
def base_url(request: pytest.FixtureRequest) -> str:
    external = os.environ.get(EXTERNAL_BASE_URL)
    if external:
        return external.rstrip("/")
    gateway: GatewayProcess = request.getfixturevalue("gateway")
    return gateway.url


# The shared clients skip cache lookups, so tests of engine behaviour (seeds, streamed equals
# non-streamed, ...) reach the engine every time. Cache tests make their own clients.
BYPASS_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture(scope="session")
def client(base_url: str) -> OpenAI:
    return OpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
        default_headers=BYPASS_CACHE,
    )


@pytest.fixture
def aclient(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=300,
        default_headers=BYPASS_CACHE,
    )


@pytest.fixture(scope="session")
def model() -> str:
    return MODEL_NAME


@pytest.fixture(scope="session")
def tokenizer() -> object:
    """The model's own tokenizer, loaded from the prepared folder, to check counts against."""
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    return AutoTokenizer.from_pretrained(bundled_model_dir(Settings().model_cache_dir))


def chat_prompt_tokens(tokenizer: object, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    return len(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path
