"""API keys over real HTTP, on a gateway started with keys."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.server import MODEL_NAME, GatewayProcess, gateway_env, start_gateway

KEY = "sk-integration-7f3a9c"
ROTATED = "sk-next-2b8e41"
HASHED = "sk-hash#4d1c9e"  # `#` inside a key is part of it
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("keyed")
    keys = folder / "keys"
    keys.write_text(
        f"# team a\n{KEY}\n  # rotated in March\n"
        f"sha256:{hashlib.sha256(ROTATED.encode()).hexdigest()}\n{HASHED}\n"
    )
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
    for headers in (
        {},
        {"authorization": "Bearer sk-wrong"},
        {"authorization": "Token x"},
        {"authorization": "Bearer"},  # an empty token
        {"authorization": "Bearer sk-hash"},
    ):
        bodies = set()
        for method, path in targets:
            response = httpx.request(method, keyed.url + path, headers=headers, json={})
            assert response.status_code == 401, (method, path, headers)
            bodies.add(response.content)
        assert len(bodies) == 1
        for path in ("/health", "/ready", "/metrics"):
            assert httpx.get(keyed.url + path, headers=headers).status_code == 200


def test_the_sdk_works_with_either_key(keyed: GatewayProcess) -> None:
    for key in (KEY, ROTATED, HASHED):
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
    assert KEY not in log and ROTATED not in log and HASHED not in log


def test_the_digest_of_the_empty_string_stops_start_up(tmp_path: Path) -> None:
    """A digest made without the key (`printf '' | sha256sum`) would let keyless requests in."""
    for value in (f"sha256:{EMPTY_DIGEST}", f"{KEY},sha256:{EMPTY_DIGEST.upper()}"):
        done = subprocess.run(
            [sys.executable, "-m", "sluicegate", "serve", "--port", "1"],
            env=gateway_env({"SLUICEGATE_API_KEYS": value}),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("sluicegate: invalid setting SLUICEGATE_API_KEYS:")
        assert "empty string" in done.stderr and KEY not in done.stderr
