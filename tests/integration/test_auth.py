"""API keys over real HTTP, on a gateway started with keys: who gets in, and that a key over
its limits is refused before any work is done on its request."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.keys import ApiKeyring
from tests.support.gateway import (
    MODEL_NAME,
    GatewayProcess,
    gateway_env,
    running_gateway,
)

KEY = "sk-integration-7f3a9c"
ROTATED = "sk-next-2b8e41"
HASHED = "sk-hash#4d1c9e"  # `#` inside a key is part of it
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
LIMITED = "sk-limited-5e21"  # two requests per minute
LIMITED_RPM = 2


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("keyed")
    keys = folder / "keys"
    keys.write_text(
        f"# team a\n{KEY}\n  # rotated in March\n"
        f"sha256:{hashlib.sha256(ROTATED.encode()).hexdigest()}\n{HASHED}\n{LIMITED}\n"
    )
    limited_id = ApiKeyring.parse(LIMITED).identify(LIMITED)
    env = {
        "SLUICEGATE_API_KEYS": f"@{keys}",
        "SLUICEGATE_RATE_LIMIT_OVERRIDES": json.dumps(
            {limited_id: {"requests_per_minute": LIMITED_RPM}}
        ),
        # One sequence in flight per key: a key holding it is easy to make.
        "SLUICEGATE_MAX_SEQUENCES_PER_KEY": "1",
    }
    with running_gateway(folder, env=env) as gateway:
        yield gateway


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


def test_a_key_over_its_request_rate_is_refused_before_its_body_is_read(
    keyed: GatewayProcess,
) -> None:
    auth = {"authorization": f"Bearer {LIMITED}"}
    with httpx.Client(base_url=keyed.url, headers=auth, timeout=60) as client:
        # /tokenize counts against the rate too, as the first of the two.
        assert client.post("/tokenize", json={"prompt": "Hi"}).status_code == 200
        ok = client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 1,
            },
        )
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-remaining-requests"] == "0"
        # Over the limit, a body that is not even valid gets the 429, not its 400: the
        # rate was checked before the body was parsed. So does a large one (the parse
        # process) and a continuation of a stored response that does not exist.
        large = "word " * 60_000  # 300 kB: over the bound for parsing in process
        for path, body in (
            ("/v1/chat/completions", {"model": MODEL_NAME, "messages": "not a list"}),
            (
                "/v1/chat/completions",
                {"model": MODEL_NAME, "messages": [{"role": "user", "content": large}]},
            ),
            (
                "/v1/responses",
                {"model": MODEL_NAME, "input": "Hi", "previous_response_id": "resp_none"},
            ),
            ("/detokenize", {"tokens": [1, 2, 3]}),
        ):
            refused = client.post(path, json=body)
            assert refused.status_code == 429, (path, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
            assert int(refused.headers["retry-after"]) >= 1


def test_a_key_holding_its_share_is_refused_before_its_request_is_prepared(
    keyed: GatewayProcess,
) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    long_stream = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=keyed.url, headers=auth, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=long_stream) as stream,
    ):
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        # The key's one sequence is taken: a continuation of a response that does not
        # exist is refused for the share (429), before the store is read (400).
        refused = client.post(
            "/v1/responses",
            json={"model": MODEL_NAME, "input": "Hi", "previous_response_id": "resp_none"},
        )
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
        # Tokenizing runs no sequence: not refused for the share.
        assert client.post("/tokenize", json={"prompt": "Hi"}).status_code == 200
        # Another key is not held back by this one's share.
        other = httpx.post(
            keyed.url + "/v1/responses",
            headers={"authorization": f"Bearer {HASHED}"},
            json={"model": MODEL_NAME, "input": "Hi", "previous_response_id": "resp_none"},
            timeout=60,
        )
        assert other.status_code == 400
        assert other.json()["error"]["code"] == "previous_response_not_found"
