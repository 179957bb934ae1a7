"""Upstream mode in front of vLLM's own OpenAI server (CPU), through the `openai` SDK.

One real `vllm.entrypoints.openai.api_server` on the bundled model, and one gateway in
upstream mode in front of it: the gateway counts tokens with the upstream's `/tokenize`, so
the token budget, the cache and the rate limits work as over the in-process engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

import sluicegate.engine
from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_fault_upstream
from tests.support.gateway import GatewayProcess, running_gateway, started_together
from tests.support.gateway import vllm_server as vllm_server_of
from tests.support.metrics import scrape, total

MODEL = "SmolLM2-135M-Instruct"
SECOND = "smol-b"
TEMPLATE = Path(sluicegate.engine.__file__).parent / "templates" / "smollm2_tools.jinja"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
# The first test's setup starts vLLM's server, which takes minutes on a busy CPU.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Both vLLM servers of the module, started at once: the first with the bundled model's
    tool template and parser, as the gateway ships them; the second under another name."""
    folder = tmp_path_factory.mktemp("vllm")
    tools = ("--chat-template", str(TEMPLATE))
    tools += ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    with started_together(
        vllm_server_of(folder, *tools), vllm_server_of(folder, served_model_name=SECOND)
    ) as urls:
        yield urls


@pytest.fixture(scope="module")
def vllm_server(vllm_servers: list[str]) -> str:
    return vllm_servers[0]


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


# ---- a registry of pools: two vLLM servers under other names, and a failing pool ---------


@pytest.fixture(scope="module")
def second_vllm(vllm_servers: list[str]) -> str:
    return vllm_servers[1]


@pytest.fixture(scope="module")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("flaky") / "flaky.log"
    upstream = start_fault_upstream(0, "--model", "flaky-model", log=log)
    try:
        yield upstream
    finally:
        upstream.stop()


@pytest.fixture(scope="module")
def registry(
    vllm_server: str,
    second_vllm: str,
    flaky: FaultUpstreamProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """One gateway, no engine of its own, over a models file: the first vLLM server under
    another name with aliases and a model-wide request limit, the second with a model-wide
    token limit, and a pool on the fault upstream falling back to the second."""
    folder = tmp_path_factory.mktemp("registry")
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: smol-a
    aliases: [default, gpt-4o-mini]
    upstreams: [{{url: "{vllm_server}"}}]
    rate_limit: {{requests_per_minute: 4}}
  - name: {SECOND}
    upstreams: [{{url: "{second_vllm}"}}]
    rate_limit: {{tokens_per_minute: 600}}
  - name: flaky
    upstreams: [{{url: "{flaky.url}"}}]
    fallbacks: [{SECOND}]
"""
    )
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_UPSTREAM_HEALTH_PATH": "/health",
        "SLUICEGATE_UPSTREAM_HEALTH_INTERVAL": "1",
        "SLUICEGATE_UPSTREAM_BREAKER_OPEN_SECONDS": "60",
    }
    with running_gateway(folder, env=env) as process:
        yield process


def chat_on(gateway: GatewayProcess, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, **extra}
    headers = {"cache-control": "no-cache"}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_requests_go_to_the_pool_their_name_or_alias_names(
    registry: GatewayProcess, vllm_server: str, second_vllm: str
) -> None:
    cards = httpx.get(registry.url + "/v1/models", timeout=10).json()["data"]
    assert {c["id"] for c in cards} == {"smol-a", "default", "gpt-4o-mini", SECOND, "flaky"}
    # Each server answers as itself; the gateway, with the name of the entry.
    direct = httpx.post(
        vllm_server + "/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0},
        timeout=60,
    ).json()["choices"][0]["message"]["content"]
    for name in ("smol-a", "gpt-4o-mini"):
        answer = chat_on(registry, name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "smol-a"
        assert answer.json()["choices"][0]["message"]["content"] == direct
    second = chat_on(registry, SECOND)
    assert second.json()["model"] == SECOND
    assert second.json()["choices"][0]["message"]["content"] == direct  # the same weights
    assert chat_on(registry, "nope").json()["error"]["code"] == "model_not_found"


def test_a_pool_that_is_down_falls_back_and_its_breaker_touches_no_other(
    registry: GatewayProcess, flaky: FaultUpstreamProcess
) -> None:
    assert chat_on(registry, "flaky").json()["model"] == "flaky"
    flaky.control(down=True)
    try:
        for _ in range(8):  # enough failures to open the flaky upstream's breaker
            answer = chat_on(registry, "flaky")
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == SECOND
            assert answer.headers["x-sluicegate-fallback"] == "flaky"
        samples = scrape(registry.url)
        breakers = {
            dict(labels)["upstream"]: value
            for (name, labels), value in samples.items()
            if name == "sluicegate_upstream_breaker_state"
        }
        assert breakers.pop(flaky.url) == 1  # open
        assert sorted(breakers.values()) == [0, 0]  # the other pools' upstreams: closed
        assert chat_on(registry, "smol-a").status_code == 200
        handed = total(samples, "sluicegate_model_fallbacks_total", model="flaky", fallback=SECOND)
        assert handed >= 8
    finally:
        flaky.control(reset_all=True)


def test_each_model_keeps_its_own_limit_in_its_own_unit(registry: GatewayProcess) -> None:
    """smol-a: 4 requests a minute across every key; smol-b: 600 tokens a minute."""
    statuses = [chat_on(registry, "default").status_code for _ in range(6)]
    assert statuses.count(200) <= 4 and statuses[-1] == 429
    refused = chat_on(registry, "smol-a")
    assert "on the model smol-a" in refused.json()["error"]["message"]
    # smol-b's window is in tokens: a request that may use more than 600 never fits it.
    large = chat_on(registry, SECOND, max_tokens=700)
    assert large.status_code == 429
    assert "the model smol-b's limit of 600 tokens" in large.json()["error"]["message"]
    assert chat_on(registry, SECOND, max_tokens=8).status_code == 200
