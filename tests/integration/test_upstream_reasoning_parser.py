"""An upstream that sends its thoughts inside the content (`<think>...</think>`, as vLLM's
server without `--reasoning-parser` or llama.cpp's with `--reasoning-format none` do), split by
the gateway with vLLM's own parser named in the models file (`reasoning_parser:`), over the
entry's tokenizer: the answer and the rendered stream carry `reasoning` apart from the content,
with its tokens counted, and no stream of such a model is passed through unsplit. The same
upstream under an entry without the parser keeps the thoughts in the content (the control).

The upstream is `tests.support.fault_upstream` answering with the words below; the tokenizer is
the bundled model's with `<think>` and `</think>` given to two spare tokens
(`tests.support.reasoning_model.reasoning_tokenizer`), as deepseek_r1's parser needs them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import running as running_upstream
from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.metrics import metric_value
from tests.support.reasoning_model import reasoning_tokenizer

THOUGHTS = ["Two", " and", " two", "."]
ANSWER = ["Water", " finds", " the", " open"]
WORDS = ["<think>", *THOUGHTS, "</think>", *ANSWER]
PASSED = "sluicegate_upstream_passed_through_total"
PLUGGED = "sluicegate_test_r1"
PLUGIN = f'''
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser


@ReasoningParserManager.register_module("{PLUGGED}")
class Plugged(DeepSeekR1ReasoningParser):
    """deepseek_r1's split under a name of the plugin's own."""
'''
"""A parser of the operator's own, registered by a file (`REASONING_PARSER_PLUGIN`)."""
BYPASS = {"cache-control": "no-cache, no-store"}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("thinker") / "upstream.log"
    with running_upstream(log, "--chunks", str(len(WORDS)), words=WORDS) as process:
        yield process


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(reasoning_tokenizer(tmp_path_factory.mktemp("tokenizer"), with_start=True))


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess, tokenizer_folder: str
) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("gateway")
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: thinker
    upstreams: [{{url: "{upstream.url}"}}]
    tokenizer: {tokenizer_folder}
    reasoning_parser: deepseek_r1
  - name: unsplit
    upstreams: [{{url: "{upstream.url}"}}]
    tokenizer: {tokenizer_folder}
  - name: plugged
    upstreams: [{{url: "{upstream.url}"}}]
    tokenizer: {tokenizer_folder}
    reasoning_parser: {PLUGGED}
"""
    )
    plugin = folder / "parsers.py"
    plugin.write_text(PLUGIN)
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_UPSTREAM_MAX_RETRIES": "0",
        "SLUICEGATE_REASONING_PARSER_PLUGIN": str(plugin),
    }
    with running_gateway(folder, env=env) as process:
        yield process


def _chat(model: str = "thinker", **extra: Any) -> dict[str, Any]:
    question = f"Think about {uuid.uuid4().hex}."
    return {"model": model, "messages": [{"role": "user", "content": question}], **extra}


def _post(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=BYPASS, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def _thought_tokens(folder: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return len(tokenizer.encode("".join(THOUGHTS), add_special_tokens=False))


def test_the_gateway_splits_the_answer_and_counts_the_thoughts(
    gateway: GatewayProcess, tokenizer_folder: str
) -> None:
    answer = _post(gateway, _chat()).json()
    message = answer["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("".join(THOUGHTS), "".join(ANSWER))
    details = answer["usage"]["completion_tokens_details"]
    assert details == {"reasoning_tokens": _thought_tokens(tokenizer_folder)}


def test_the_stream_is_split_by_the_gateway_not_passed_through(gateway: GatewayProcess) -> None:
    before = metric_value(gateway.url, PASSED)
    stream = _post(gateway, _chat(stream=True)).text
    assert metric_value(gateway.url, PASSED) == before
    thought, content = [], []
    for line in stream.split("\n"):
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                assert not "".join(content), "a thought after the content"
                thought.append(delta["reasoning"])
            content.append(delta.get("content") or "")
    assert ("".join(thought), "".join(content)) == ("".join(THOUGHTS), "".join(ANSWER))
    assert "<think>" not in stream and "</think>" not in stream


def test_hidden_thoughts_leave_the_answer_alone(gateway: GatewayProcess) -> None:
    answer = _post(gateway, _chat(include_reasoning=False)).json()
    message = answer["choices"][0]["message"]
    assert message.get("reasoning") is None and message["content"] == "".join(ANSWER)


def test_without_the_parser_the_thoughts_stay_in_the_content(gateway: GatewayProcess) -> None:
    message = _post(gateway, _chat("unsplit")).json()["choices"][0]["message"]
    assert message["content"] == "".join(WORDS)
    assert message.get("reasoning") is None


def test_a_parser_from_a_plugin_file_splits_alike(gateway: GatewayProcess) -> None:
    message = _post(gateway, _chat("plugged")).json()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("".join(THOUGHTS), "".join(ANSWER))
