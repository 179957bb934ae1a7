"""Upstream mode counting with the upstream's own `/tokenize`: a bounded number of calls.

The upstream is `tests.support.fault_upstream --tokenize`, whose toy tokenizer answers in vLLM's
shape and whose completion routes refuse (400, as vLLM's) a prompt that does not fit its
window; `/_stats` counts the `/tokenize` calls. Each call is one HTTP request, so the budget
must fit a long conversation with a handful of them, not one per message and sentence.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import start as start_upstream
from tests.support.gateway import GatewayProcess, running_gateway

MAX_TOKENIZE_CALLS = 8
SENTENCE = "The gate held back the water while the fields below stayed green. "


def _long_turn(size: int) -> str:
    """`size` characters of numbered sentences (no two alike: no repeat is dropped)."""
    parts, length, n = [], 0, 0
    while length < size:
        part = f"Note {n}: {SENTENCE}"
        parts.append(part)
        length += len(part)
        n += 1
    return "".join(parts)


@pytest.fixture(scope="module", params=[4096, 32768], ids=["4k", "32k"])
def upstream(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FaultUpstreamProcess, int]]:
    window = int(request.param)
    log = tmp_path_factory.mktemp("fault") / "upstream.log"
    upstream = start_upstream(0, "--tokenize", "--max-model-len", str(window), log=log)
    try:
        yield upstream, window
    finally:
        upstream.stop()


@pytest.fixture
def gateway(upstream: tuple[FaultUpstreamProcess, int], tmp_path: Path) -> Iterator[GatewayProcess]:
    env = {
        "SLUICEGATE_UPSTREAM_URLS": upstream[0].url,
        "SLUICEGATE_CACHE_POLICY": "off",
        "SLUICEGATE_UPSTREAM_HEALTH_INTERVAL": "60",
    }
    with running_gateway(tmp_path, env=env) as gateway:
        yield gateway


def test_a_long_chat_turn_is_fitted_with_a_handful_of_tokenize_calls(
    upstream: tuple[FaultUpstreamProcess, int], gateway: GatewayProcess
) -> None:
    fault, window = upstream
    assert "counts with the /tokenize of upstream" in gateway.log()
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": _long_turn(120_000)},
        {"role": "assistant", "content": "Noted, every one of them."},
        {"role": "user", "content": "Which note came last?"},
    ]
    fault.control(reset_stats=True)
    body = {"model": "fault-model", "messages": messages, "max_tokens": 64}
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=120)
    # The upstream refuses (400) a prompt that leaves less than max_tokens of its window.
    assert reply.status_code == 200, reply.text
    calls = fault.stats()["requests"].get("/tokenize", 0)
    assert 1 <= calls <= MAX_TOKENIZE_CALLS, calls
    after = int(reply.headers["x-budget-prompt-tokens-after"])
    assert int(reply.headers["x-budget-prompt-tokens-before"]) > window
    assert "cut_turn" in reply.headers["x-budget-truncation"]
    assert reply.headers["x-budget-messages-dropped"] == "0"
    # The upstream's own count of what it was sent, against what the budget fitted.
    prompt_tokens = reply.json()["usage"]["prompt_tokens"]
    assert prompt_tokens == after
    assert after + int(reply.headers["x-budget-max-tokens"]) <= window
    # Fitted close to the window, not cut to a fraction of it.
    assert after >= window * 0.8, (after, window)
