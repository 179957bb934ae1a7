"""Upstream mode in front of vLLM's own OpenAI server (CPU), through the `openai` SDK.

One real `vllm.entrypoints.openai.api_server` on the bundled model, and one gateway in
upstream mode in front of it: the gateway counts tokens with the upstream's `/tokenize`, so
the token budget, the cache and the rate limits work as over the in-process engine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

import sluicegate.engine
from sluicegate.engine.model import bundled_model_dir
from sluicegate.settings import Settings
from tests.support.gateway import (
    GatewayProcess,
    engine_core,
    free_port,
    peer_process,
    running_gateway,
)

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(sluicegate.engine.__file__).parent / "templates" / "smollm2_tools.jinja"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
# The first test's setup starts vLLM's server, which takes minutes on a busy CPU.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **engine_core()}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(bundled_model_dir(Settings().model_cache_dir)),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
        "--disable-uvicorn-access-log",
        # The bundled model's tool template and parser, as the gateway ships them.
        "--chat-template", str(TEMPLATE),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with peer_process(command, f"http://127.0.0.1:{port}/health", log, env):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def gateway(vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {"SLUICEGATE_UPSTREAM_URLS": vllm_server, "SLUICEGATE_UPSTREAM_HEALTH_PATH": "/health"}
    with running_gateway(tmp_path_factory.mktemp("gw"), env=env) as process:
        yield process


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_the_model_comes_from_the_upstream(client: OpenAI) -> None:
    card = client.models.list().data[0]
    assert card.id == MODEL
    assert card.model_extra is not None and card.model_extra["max_model_len"] == 2048


def test_chat_with_budget_headers_and_a_cache_hit(client: OpenAI, tokenizer: object) -> None:
    from tests.integration.conftest import chat_prompt_tokens

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    answer = raw.parse()
    assert answer.choices[0].message.content
    assert answer.usage is not None
    expected = chat_prompt_tokens(tokenizer, MESSAGES)
    assert answer.usage.prompt_tokens == expected
    assert raw.headers["x-budget-prompt-tokens-after"] == str(expected)
    assert raw.headers["x-budget-max-tokens"] == "12"
    assert raw.headers["x-cache"] == "MISS"
    again = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    assert again.headers["x-cache"] == "HIT"
    assert again.parse().choices[0].message.content == answer.choices[0].message.content


def test_chat_stream_with_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length"


def test_completions_streamed_and_not(client: OpenAI) -> None:
    answer = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=6, temperature=0
    )
    assert answer.choices[0].text and answer.usage is not None
    assert answer.usage.completion_tokens == 6
    streamed = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=6, temperature=0, stream=True
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == answer.choices[0].text


def test_required_tool_calls_pass_through(client: OpenAI, vllm_server: str) -> None:
    """The gateway's calls, whole and streamed, are the ones vLLM's server makes itself."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        "tools": [tool],
        # vLLM's server constrains `required` calls; its named calls here are free text.
        "tool_choice": "required",
        "max_tokens": 120,
        "temperature": 0,
    }
    direct = OpenAI(base_url=vllm_server, api_key="unused", max_retries=0)
    expected = direct.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
    answer = client.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
    assert expected.message.tool_calls and answer.message.tool_calls
    call, wanted = answer.message.tool_calls[0], expected.message.tool_calls[0]
    assert call.function.name == wanted.function.name == "get_weather"
    # vLLM re-serializes whole answers' arguments, and streams them as the model wrote them.
    assert json.loads(call.function.arguments) == json.loads(wanted.function.arguments)
    assert call.id != wanted.id and call.id.startswith("call_")
    assert answer.finish_reason == expected.finish_reason == "tool_calls"
    names, arguments = [], []
    for chunk in client.chat.completions.create(**ask, stream=True, seed=1):  # type: ignore[call-overload]
        for delta in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            if delta.function and delta.function.name:
                names.append(delta.function.name)
            if delta.function and delta.function.arguments:
                arguments.append(delta.function.arguments)
    assert names == ["get_weather"]
    assert "".join(arguments) == call.function.arguments


def test_a_context_overflow_is_fitted_by_the_budget(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    long = [{"role": "user", "content": "word " * 3000}]
    reply = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": long, "max_tokens": 8, "truncation": "disabled"},
        timeout=60,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
