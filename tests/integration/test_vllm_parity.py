"""The in-process engine against vLLM's own server on the same model: LoRA adapters (made here)
and Anthropic's Messages API through the `anthropic` SDK; and an upstream pool beside the
engine in one gateway.

Adapters made here with peft on the bundled model (nothing from a hub). vLLM's server runs with
`--enable-lora --lora-modules`; the gateway runs the real engine with `LORA_MODULES`, runtime
loading, API and admin keys, and a models file that also fronts a pool: vLLM's server and a
fault upstream serving the same base model, of which only vLLM's lists the adapter. Runtime
loads come from the adapters' folder (`LORA_ROOTS`).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic import Anthropic

from tests.support.adapters import make_adapters, with_base_model
from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_fault_upstream
from tests.support.gateway import (
    MODEL_NAME,
    GatewayProcess,
    free_port,
    running_gateway,
    started_together,
    vllm_server,
)
from tests.support.metrics import scrape

USER, ADMIN = "sk-lora-user-0123", "sk-lora-admin-4567"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    made = make_adapters(folder, {"ad1": 0, "ad2": 1})
    made["rank16"] = make_adapters(folder, {"rank16": 2}, rank=16)["rank16"]
    made["foreign"] = with_base_model(made["ad2"], folder / "foreign", "meta-llama/Llama-3.1-8B")
    return made


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    """A second upstream of the pool, serving the base model's name and no adapter."""
    log = tmp_path_factory.mktemp("plain") / "plain.log"
    upstream = start_fault_upstream(0, "--model", MODEL_NAME, log=log)
    try:
        yield upstream
    finally:
        upstream.stop()


@pytest.fixture(scope="module")
def servers(
    adapters: dict[str, Path],
    plain: FaultUpstreamProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, GatewayProcess]]:
    """vLLM's server and the gateway, started at once (the gateway's pool waits for vLLM's
    `/v1/models`). vLLM's has ad1, also listed as remote-ad1 (the pool's adapter), and ad2 as
    vllm-ad2 (names the gateway's own adapters do not take)."""
    folder = tmp_path_factory.mktemp("servers")
    port = free_port()
    vllm_url = f"http://127.0.0.1:{port}/v1"
    flags = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-cpu-loras", "4"]
    flags += ["--lora-modules", f"ad1={adapters['ad1']}", f"remote-ad1={adapters['ad1']}"]
    flags += [f"vllm-ad2={adapters['ad2']}"]
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: {MODEL_NAME}
    engine: local
  - name: remote
    upstreams: [{{url: "{vllm_url}"}}, {{url: "{plain.url}"}}]
"""
    )
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_LORA_MODULES": f"ad1={adapters['ad1']}",
        "SLUICEGATE_ALLOW_RUNTIME_LORA": "true",
        "SLUICEGATE_LORA_ROOTS": str(adapters["ad2"].parent),
        "SLUICEGATE_MAX_LORA_RANK": "8",
        "SLUICEGATE_MAX_LORAS": "2",
        "SLUICEGATE_API_KEYS": USER,
        "SLUICEGATE_ADMIN_API_KEYS": ADMIN,
        "SLUICEGATE_UPSTREAM_HEALTH_INTERVAL": "1",
        # vLLM's server starts beside it, as slowly as the gateway's own engine.
        "SLUICEGATE_UPSTREAM_START_TIMEOUT": "400",
    }
    with started_together(
        vllm_server(folder, *flags, port=port), running_gateway(folder, env=env)
    ) as (url, gateway):
        yield url, gateway


@pytest.fixture(scope="module")
def vllm(servers: tuple[str, GatewayProcess]) -> str:
    return servers[0]


@pytest.fixture(scope="module")
def gateway(servers: tuple[str, GatewayProcess]) -> GatewayProcess:
    return servers[1]


def post(url: str, path: str, body: dict[str, Any], key: str | None = USER) -> httpx.Response:
    headers = {"cache-control": "no-cache"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(url + path, json=body, headers=headers, timeout=120)


def text_of(response: httpx.Response, chat: bool, stream: bool) -> str:
    assert response.status_code == 200, response.text
    if not stream:
        choice = response.json()["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    pieces = []
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                pieces.append(choice["delta"].get("content") or "" if chat else choice["text"])
    return "".join(pieces)


def ask(url: str, model: str, chat: bool, stream: bool, key: str | None = USER) -> str:
    body: dict[str, Any] = {"model": model, "max_tokens": 16, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = MESSAGES
    else:
        body["prompt"] = PROMPT
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return text_of(post(url, path, body, key), chat, stream)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_adapter_answers_as_vllms_server_does_with_it(
    gateway: GatewayProcess, vllm: str, chat: bool, stream: bool
) -> None:
    vllm_root = vllm.removesuffix("/v1")
    ours = ask(gateway.url, "ad1", chat, stream)
    theirs = ask(vllm_root, "ad1", chat, stream, key=None)
    assert ours == theirs
    base = ask(gateway.url, MODEL_NAME, chat, stream)
    assert base == ask(vllm_root, MODEL_NAME, chat, stream, key=None)
    assert ours != base, "the adapter changed nothing: the test would prove nothing"


def test_an_adapter_is_cached_apart_from_its_base(gateway: GatewayProcess) -> None:
    body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    headers = {"authorization": f"Bearer {USER}"}
    answers = {}
    for model in ("ad1", MODEL_NAME, "ad1", MODEL_NAME):
        response = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={**body, "model": model},
            headers=headers,
            timeout=120,
        )
        assert response.status_code == 200
        content = response.json()["choices"][0]["message"]["content"]
        if model in answers:
            assert response.headers["x-cache"] == "HIT" and content == answers[model]
        answers[model] = content
    assert answers["ad1"] != answers[MODEL_NAME]


def test_models_lists_the_base_its_adapters_and_the_pools(gateway: GatewayProcess) -> None:
    response = httpx.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {USER}"})
    cards = {c["id"]: c for c in response.json()["data"]}
    assert cards[MODEL_NAME]["parent"] is None
    assert cards["ad1"]["parent"] == MODEL_NAME
    assert cards["remote"]["parent"] is None
    assert cards["remote-ad1"]["parent"] == "remote"


def test_the_engines_lora_metric_is_exported(gateway: GatewayProcess) -> None:
    samples = scrape(gateway.url)
    infos = [dict(labels) for (name, labels) in samples if name == "vllm:lora_requests_info"]
    assert infos, "vllm:lora_requests_info is not on /metrics"
    assert {info["max_lora"] for info in infos} == {"2"}
    assert {"running_lora_adapters", "waiting_lora_adapters"} <= set(infos[0])


def test_adapters_load_and_unload_at_run_time_for_admin_keys_only(
    gateway: GatewayProcess, adapters: dict[str, Path], vllm: str
) -> None:
    load = {"lora_name": "ad2", "lora_path": str(adapters["ad2"])}
    assert post(gateway.url, "/v1/load_lora_adapter", load, key=None).status_code == 401
    refused = post(gateway.url, "/v1/load_lora_adapter", load)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    loaded = post(gateway.url, "/v1/load_lora_adapter", load, key=ADMIN)
    assert loaded.status_code == 200, loaded.text
    # Usable by the next request, as vLLM's server answers with the same adapter.
    ours = ask(gateway.url, "ad2", chat=True, stream=False)
    assert ours == ask(vllm.removesuffix("/v1"), "vllm-ad2", chat=True, stream=False, key=None)
    assert ours != ask(gateway.url, "ad1", chat=True, stream=False)
    cards = httpx.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {USER}"})
    assert {"id": "ad2", "parent": MODEL_NAME}.items() <= next(
        c for c in cards.json()["data"] if c["id"] == "ad2"
    ).items()
    unload = {"lora_name": "ad2"}
    assert post(gateway.url, "/v1/unload_lora_adapter", unload).status_code == 403
    assert post(gateway.url, "/v1/unload_lora_adapter", unload, key=ADMIN).status_code == 200
    gone = post(
        gateway.url,
        "/v1/chat/completions",
        {"model": "ad2", "messages": MESSAGES, "max_tokens": 4},
    )
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("name", "path_of", "says"),
    [
        ("bad", lambda a: f"{a['ad2'].parent}/nowhere", "no adapter folder at /"),
        ("far", lambda a: "/nowhere/adapter", "outside the folders adapters may be loaded"),
        ("wide", lambda a: str(a["rank16"]), "rank 16 is over the engine's max_lora_rank 8"),
        (
            "foreign",
            lambda a: str(a["foreign"]),
            "made for the base model 'meta-llama/Llama-3.1-8B'",
        ),
        ("ad1", lambda a: str(a["ad2"]), "is already served"),
    ],
)
def test_an_adapter_that_cannot_be_loaded_is_a_400_saying_which(
    gateway: GatewayProcess, adapters: dict[str, Path], name: str, path_of: Any, says: str
) -> None:
    body = {"lora_name": name, "lora_path": path_of(adapters)}
    response = post(gateway.url, "/v1/load_lora_adapter", body, key=ADMIN)
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]["message"]
    assert ask(gateway.url, MODEL_NAME, chat=True, stream=False)  # the engine still serves


def test_an_adapter_evicted_after_its_folder_went_comes_back_from_its_snapshot(
    gateway: GatewayProcess, adapters: dict[str, Path]
) -> None:
    """vLLM keeps MAX_LORAS (2) adapters in memory and reads one it evicted again from the path
    it was given, inside a model step: had that been the folder, removed since, the engine
    would die. It is the gateway's snapshot, and the adapter answers as it did."""
    copies = {name: adapters["ad2"].parent / name for name in ("gone-a", "kept-b")}
    for copy in copies.values():
        shutil.copytree(adapters["ad2"], copy)
        load = {"lora_name": copy.name, "lora_path": str(copy)}
        assert post(gateway.url, "/v1/load_lora_adapter", load, key=ADMIN).status_code == 200
    before = ask(gateway.url, "gone-a", chat=True, stream=False)
    shutil.rmtree(copies["gone-a"])
    for other in ("kept-b", "ad1", "kept-b", "ad1"):  # the two most recent: gone-a evicted
        ask(gateway.url, other, chat=True, stream=False)
    assert ask(gateway.url, "gone-a", chat=True, stream=False) == before
    assert ask(gateway.url, MODEL_NAME, chat=True, stream=False)  # the engine lives
    for name in copies:
        unload = {"lora_name": name}
        assert post(gateway.url, "/v1/unload_lora_adapter", unload, key=ADMIN).status_code == 200


def test_unloading_an_adapter_in_use_lets_its_stream_finish(
    gateway: GatewayProcess, adapters: dict[str, Path]
) -> None:
    load = {"lora_name": "ad2", "lora_path": str(adapters["ad2"])}
    assert post(gateway.url, "/v1/load_lora_adapter", load, key=ADMIN).status_code == 200
    body = {
        "model": "ad2",
        "messages": MESSAGES,
        "max_tokens": 200,
        "min_tokens": 200,
        "temperature": 0,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {USER}", "cache-control": "no-cache"}
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream(
            "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=300
        ) as response:
            for line in response.iter_lines():
                lines.append(line)
                if '"content"' in line:
                    started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(120), "the stream did not begin"
    unloaded = post(gateway.url, "/v1/unload_lora_adapter", {"lora_name": "ad2"}, key=ADMIN)
    assert unloaded.status_code == 200
    gone = post(gateway.url, "/v1/chat/completions", {**body, "stream": False, "max_tokens": 2})
    assert gone.status_code == 404
    reader.join(300)
    assert not reader.is_alive()
    finishes = [
        json.loads(line[6:])["choices"][0]["finish_reason"]
        for line in lines
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    ]
    assert finishes[-1] == "length"
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert not any('"error"' in line for line in lines)


def test_the_engine_and_a_pool_answer_in_one_gateway(
    gateway: GatewayProcess, vllm: str, plain: FaultUpstreamProcess
) -> None:
    """The pool's base model goes to either of its upstreams; its adapter only to vLLM's, the
    one that lists it (well within the load bound, nothing else being in flight)."""
    plain.control(reset_stats=True)
    seen = set()
    for _ in range(16):  # each picks one of two idle upstreams at random
        seen.add(ask(gateway.url, "remote", chat=True, stream=False))
    assert len(seen) == 2  # the fault upstream's canned words, and the model's
    for _ in range(6):
        answer = ask(gateway.url, "remote-ad1", chat=True, stream=False)
        assert answer == ask(vllm.removesuffix("/v1"), "ad1", chat=True, stream=False, key=None)
    assert "remote-ad1" not in plain.stats()["models"]
    local = ask(gateway.url, MODEL_NAME, chat=True, stream=False)
    assert local and local in seen  # the in-process engine: the same weights as vLLM's


# ---- Anthropic's Messages API, through the anthropic SDK ------------------------------------


def anthropic_client(url: str, key: str | None = USER) -> Anthropic:
    return Anthropic(base_url=url, api_key=key or "unused", max_retries=0, timeout=120)


GREEDY = {"temperature": 0}  # passed in extra_body: current SDKs take no `temperature` keyword


def test_messages_answer_as_vllms_server_does(gateway: GatewayProcess, vllm: str) -> None:
    ours = anthropic_client(gateway.url)
    theirs = anthropic_client(vllm.removesuffix("/v1"), key=None)
    ask: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 24,
        "system": "You answer in one sentence.",
        "messages": MESSAGES,
        "extra_body": GREEDY,
        "extra_headers": {"cache-control": "no-cache"},
    }
    created = ours.messages.create(**ask)
    expected = theirs.messages.create(**ask)
    assert created.content[0].type == "text" and expected.content[0].type == "text"
    assert created.content[0].text == expected.content[0].text
    assert created.stop_reason == expected.stop_reason
    assert created.usage.input_tokens == expected.usage.input_tokens
    assert created.usage.output_tokens == expected.usage.output_tokens
    with ours.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == created.content[0].text
    assert final.stop_reason == created.stop_reason and final.usage.output_tokens > 0
    with theirs.messages.stream(**ask) as stream:
        assert "".join(stream.text_stream) == streamed


def test_a_named_tool_gives_valid_input_and_its_result_continues(gateway: GatewayProcess) -> None:
    client = anthropic_client(gateway.url)
    tool = {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    }
    asked = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    message = client.messages.create(
        model=MODEL_NAME,
        max_tokens=80,
        messages=asked,
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert message.stop_reason == "tool_use"
    use = next(block for block in message.content if block.type == "tool_use")
    assert use.name == "get_weather"
    jsonschema.validate(use.input, tool["input_schema"])
    # `any` too, streamed: the input assembled from its deltas is valid as well.
    with client.messages.stream(
        model=MODEL_NAME,
        max_tokens=80,
        messages=asked,
        tools=[tool],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    streamed_use = next(block for block in final.content if block.type == "tool_use")
    jsonschema.validate(streamed_use.input, tool["input_schema"])
    turns = [
        *asked,
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."},
            ],
        },
    ]
    follow = client.messages.create(
        model=MODEL_NAME, max_tokens=24, messages=turns, tools=[tool], extra_body=GREEDY
    )
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow.content


def test_count_tokens_is_what_a_message_is_charged(gateway: GatewayProcess) -> None:
    client = anthropic_client(gateway.url)
    ask: dict[str, Any] = {"model": MODEL_NAME, "system": "Be brief.", "messages": MESSAGES}
    counted = client.messages.count_tokens(**ask)
    created = client.messages.create(**ask, max_tokens=4, extra_body=GREEDY)
    assert counted.input_tokens == created.usage.input_tokens > 0


def test_messages_errors_are_anthropics(gateway: GatewayProcess) -> None:
    client = anthropic_client(gateway.url)
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.post(
            "/v1/messages",
            body={"model": MODEL_NAME, "messages": MESSAGES},
            cast_to=httpx.Response,
        )
    assert missing.value.status_code == 400
    assert missing.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "max_tokens" in missing.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(gateway.url, key="sk-wrong").messages.create(
            model=MODEL_NAME, max_tokens=4, messages=MESSAGES
        )
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=4, messages=MESSAGES)
