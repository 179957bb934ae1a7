"""Upstream mode in front of llama.cpp's server (`llama-cpp-python[server]`), on the GGUF the
bundled model is converted from, through the `openai` SDK.

llama.cpp's server has no `/tokenize` in vLLM's shape and streams no usage: the gateway
counts with a local tokenizer (`SLUICEGATE_TOKENIZER`, the converted bundled model, whose
template and vocabulary are the GGUF's), so the budget, the usage and the cache still work.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
from openai import OpenAI

from sluicegate.engine.model import GGUF_FILE, bundled_model_dir, gguf_folder
from sluicegate.settings import Settings
from tests.integration.conftest import chat_prompt_tokens
from tests.support.gateway import (
    PORT_TRIES,
    GatewayProcess,
    PortTaken,
    free_port,
    peer_process,
    running_gateway,
)

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llamacpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("llamacpp")
    for _ in range(PORT_TRIES):
        port = free_port()
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_folder() / GGUF_FILE),
            "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "2048", "--interrupt_requests", "False",
            "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False",
        ]  # fmt: skip
        # No /health: its model list answers once the model is loaded.
        ready = f"http://127.0.0.1:{port}/v1/models"
        with contextlib.ExitStack() as stack:
            try:
                log = folder / f"server-{port}.log"
                stack.enter_context(peer_process(command, ready, log, timeout=120))
            except PortTaken:
                continue  # taken after free_port chose it: another
            yield f"http://127.0.0.1:{port}/v1"
            return
    raise RuntimeError(f"llama.cpp's server did not start: {PORT_TRIES} ports taken in turn")


@pytest.fixture(scope="module")
def gateway(
    llamacpp_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    env = {
        "SLUICEGATE_UPSTREAM_URLS": llamacpp_server,
        "SLUICEGATE_TOKENIZER": str(bundled_model_dir(Settings().model_cache_dir)),
    }
    with running_gateway(tmp_path_factory.mktemp("gw"), env=env) as process:
        yield process


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_chat_counts_with_the_local_tokenizer_and_hits_the_cache(
    client: OpenAI, tokenizer: object
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
    )
    answer = raw.parse()
    assert answer.choices[0].message.content
    expected = chat_prompt_tokens(tokenizer, MESSAGES)
    assert answer.usage is not None and answer.usage.prompt_tokens == expected
    assert raw.headers["x-budget-prompt-tokens-after"] == str(expected)
    again = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
    )
    assert again.headers["x-cache"] == "HIT"
    assert again.parse().choices[0].message.content == answer.choices[0].message.content


def test_chat_stream_ends_with_usage_though_the_upstream_sends_none(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0.5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= 8 and usage.prompt_tokens > 0


def test_a_text_completion_goes_as_text(client: OpenAI) -> None:
    answer = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert answer.choices[0].text
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
