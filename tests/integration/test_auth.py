"""API keys over real HTTP, on a gateway started with keys."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.server import MODEL_NAME, GatewayProcess, start_gateway

KEY = "sk-integration-7f3a9c"
ROTATED = "sk-next-2b8e41"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("keyed")
    keys = folder / "keys"
    keys.write_text(f"{KEY}\nsha256:{hashlib.sha256(ROTATED.encode()).hexdigest()}\n")
    gateway = start_gateway(folder, env={"SLUICEGATE_API_KEYS": f"@{keys}"})
    yield gateway
    gateway.stop()


def test_only_health_ready_and_metrics_answer_without_a_key(keyed: GatewayProcess) -> None:
    targets = [
        ("GET", "/v1/models"),
        ("GET", f"/v1/models/{MODEL_NAME}"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/v1/unknown"),
    ]
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": "Token x"}):
        bodies = set()
        for method, path in targets:
            response = httpx.request(method, keyed.url + path, headers=headers, json={})
            assert response.status_code == 401, (method, path, headers)
            bodies.add(response.content)
        assert len(bodies) == 1
        for path in ("/health", "/ready", "/metrics"):
            assert httpx.get(keyed.url + path, headers=headers).status_code == 200


def test_the_sdk_works_with_either_key(keyed: GatewayProcess) -> None:
    for key in (KEY, ROTATED):
        client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="sk-nope", max_retries=0).models.list()
    assert caught.value.code == "invalid_api_key"


def test_keys_stay_out_of_the_log(keyed: GatewayProcess) -> None:
    httpx.get(f"{keyed.url}/v1/models", headers={"authorization": f"Bearer {KEY}"})
    log = Path(keyed.log_path).read_text(errors="replace")
    assert KEY not in log and ROTATED not in log
