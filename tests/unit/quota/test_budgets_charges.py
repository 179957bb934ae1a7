"""What a budgeted key is charged and refused, over real HTTP (one replica of the real app,
fake engines standing in for the local engine and two pools, a real Redis): a run no engine
took up is charged nothing, to the key's tokens per minute and budget alike, even over a
fallback chain; a key whose budget is used up is refused before its body is parsed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.errors import BadGatewayError, EngineUnavailableError
from tests.support.fakes import FakeEngine, models_file, serve_in_thread
from tests.support.replicas import auth, create_key, replica

TPM = 60
"""A token a second comes back: a charge the test should not see stays seen."""
BUDGET = 1000
PROMPT = 3
"""'user hi there', as the fake engines' whitespace tokenizer counts it."""
MODELS = """
models:
  - name: first
    upstreams: [{url: "http://first.test/v1"}]
    fallbacks: [second]
  - name: second
    upstreams: [{url: "http://second.test/v1"}]
  - name: uncounted
    upstreams: [{url: "http://uncounted.test/v1"}]
  - name: local
    engine: local
"""


class Gateway:
    def __init__(self, url: str, pools: dict[str, FakeEngine]) -> None:
        self.url = url
        self.first, self.second = pools["http://first.test/v1"], pools["http://second.test/v1"]
        self.uncounted = pools["http://uncounted.test/v1"]

    def chat(self, key: str, model: str, **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi there"}], **extra}
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=body, headers=auth(key), timeout=10
        )


@pytest.fixture
def gateway(prefix: str, tmp_path: Path) -> Iterator[Gateway]:
    pools = {
        "http://first.test/v1": FakeEngine(fail_before_output=BadGatewayError("it failed")),
        "http://second.test/v1": FakeEngine(fail_before_output=EngineUnavailableError()),
        # An upstream with no tokenizer: it renders chats and counts their tokens itself.
        "http://uncounted.test/v1": FakeEngine(tokenizer=None, renders_chat=True),  # type: ignore[arg-type]
    }
    app = replica(
        prefix,
        pools=pools,
        models_file=models_file(tmp_path, MODELS),
        rate_limit_tokens_per_minute=TPM,
    )
    with serve_in_thread(app) as url:
        yield Gateway(url, pools)


@pytest.mark.parametrize("stream", [True, False])
def test_a_fallback_chain_whose_models_all_fail_first_charges_nothing(
    gateway: Gateway, stream: bool
) -> None:
    key = create_key(gateway.url, budget={"tokens": BUDGET, "period": "day"})["key"]
    for _ in range(3):
        failed = gateway.chat(key, "first", max_tokens=5, stream=stream)
        assert failed.status_code == 503, failed.text
    assert len(gateway.first.requests) == len(gateway.second.requests) == 3  # both tried
    probe = gateway.chat(key, "local", max_tokens=1)
    assert probe.status_code == 200, probe.text
    # Whole but for the probe's own reservation: each failed model's prompt, kept, would
    # have taken 3 tokens each time (18 of both), and a token comes back a second.
    assert probe.headers["x-ratelimit-remaining-tokens"] == str(TPM - PROMPT - 1)
    assert probe.headers["x-sluicegate-budget-remaining"] == str(BUDGET - PROMPT - 1)


def test_a_key_whose_budget_is_used_up_is_refused_before_its_body_is_parsed(
    gateway: Gateway,
) -> None:
    key = create_key(gateway.url, budget={"tokens": 6, "period": "day"})["key"]
    spent = gateway.chat(key, "local", max_tokens=3)  # 3 + 3 ("Hello there!"): all of it
    assert spent.status_code == 200, spent.text
    assert spent.json()["usage"]["total_tokens"] == 6
    deadline = time.monotonic() + 10
    while True:
        # A body that could not be parsed: refused for the budget, not as a bad request.
        for path in ("/v1/chat/completions", "/v1/messages"):
            refused = httpx.post(
                f"{gateway.url}{path}",
                content=b'{"model": "local", "messages": [' + b"x" * 100_000,
                headers={**auth(key), "content-type": "application/json"},
                timeout=10,
            )
            if refused.status_code != 429:
                break
        else:
            break
        # What was used reaches this process with its next sync (a tenth of a second).
        assert time.monotonic() < deadline, f"never refused first: {refused.text}"
        time.sleep(0.05)
    openai = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=b"{nope",
        headers={**auth(key), "content-type": "application/json"},
        timeout=10,
    )
    assert openai.status_code == 429
    error = openai.json()["error"]
    assert error["code"] == error["type"] == "insufficient_quota"
    assert openai.headers["x-sluicegate-budget-remaining"] == "0"
    assert refused.json()["type"] == "error"  # /v1/messages: Anthropic's envelope
    assert refused.json()["error"]["type"] == "rate_limit_error"


def test_a_prompt_no_tokenizer_counts_reserves_a_bound_against_the_budget(
    gateway: Gateway,
) -> None:
    """Not only its completion: however many such requests run at once, the budget holds."""
    key = create_key(gateway.url, budget={"tokens": BUDGET, "period": "day"})["key"]
    small = gateway.chat(key, "uncounted", max_tokens=3)
    assert small.status_code == 200, small.text
    # Its prompt's bound (its JSON's bytes and 256 for the template) was reserved too.
    assert int(small.headers["x-sluicegate-budget-remaining"]) <= BUDGET - 256 - 3
    body = {"model": "uncounted", "messages": [{"role": "user", "content": "word " * 200}]}
    large = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**body, "max_tokens": 3},
        headers=auth(key),
        timeout=10,
    )
    assert large.status_code == 429, large.text
    assert large.json()["error"]["code"] == "insufficient_quota"
    assert len(gateway.uncounted.requests) == 1
