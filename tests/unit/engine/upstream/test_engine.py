"""`UpstreamEngine.generate` over a fake upstream (httpx's mock transport): which steps are
flagged as retried, and which error a request gets when its retry has nowhere to go."""

from __future__ import annotations

import json

import httpx
import pytest

from sluicegate.engine.protocol import ChatPrompt, EngineStep, Prompt, SamplingOptions
from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig, RetryConfig, UpstreamConfig
from sluicegate.engine.upstream.engine import UpstreamEngine
from sluicegate.engine.upstream.server import Upstream
from sluicegate.errors import BadGatewayError, EngineUnavailableError, RateLimitError

PROMPT = Prompt([], chat=ChatPrompt([{"role": "user", "content": "hi"}]))
OPTIONS = SamplingOptions(max_tokens=4)


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


ANSWER = _sse(
    {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
)


class FakeUpstreamCompletions:
    """Answers each completion request with the next of `statuses` (200: `ANSWER`
    streamed, in one piece per event; 0: the connection is refused)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.requests = 0

    retry_after: str | None = None
    """Sent with each error status as `Retry-After`."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        status = self.statuses.pop(0)
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        if status != 200:
            headers = {} if self.retry_after is None else {"retry-after": self.retry_after}
            body = {"error": {"message": f"injected {status}"}}
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(200, content=ANSWER)


def _engine(
    fake: FakeUpstreamCompletions, failures: int = 5, open_seconds: float = 5.0
) -> UpstreamEngine:
    upstream = Upstream(
        "http://10.0.0.1:8000/v1",
        1.0,
        PoolConfig(),
        BreakerConfig(failures=failures, open_seconds=open_seconds),
        transport=httpx.MockTransport(fake.handler),
    )
    config = UpstreamConfig(
        urls=((upstream.url, 1.0),), retry=RetryConfig(backoff=0.001, backoff_max=0.01)
    )
    return UpstreamEngine(config, [upstream], "model", 2048)


async def _steps(engine: UpstreamEngine) -> list[EngineStep]:
    return [s async for s in engine.generate("r", PROMPT, OPTIONS, arrival_time=0.0)]


async def test_the_steps_of_a_retried_run_are_flagged_and_no_others() -> None:
    fake = FakeUpstreamCompletions(503, 200, 200)
    engine = _engine(fake)
    retried = await _steps(engine)
    assert fake.requests == 2
    assert "".join(c.text for s in retried for c in s.choices) == "Hello there"
    assert retried and all(s.retried for s in retried)
    first_time = await _steps(engine)
    assert first_time and not any(s.retried for s in first_time)
    await engine.shutdown()


async def test_a_retry_with_nowhere_to_go_gets_the_failure_not_no_upstream_available() -> None:
    # One upstream; its first failure opens its breaker, so the retry finds none available.
    fake = FakeUpstreamCompletions(0)
    engine = _engine(fake, failures=1)
    with pytest.raises(BadGatewayError) as caught:
        await _steps(engine)
    assert caught.value.message == "Could not connect to the upstream server."
    assert fake.requests == 1
    await engine.shutdown()


async def test_the_start_up_error_names_the_upstreams_without_their_credentials() -> None:
    from sluicegate.engine.upstream.discovery import UpstreamStartError, discover

    upstream = Upstream(
        "http://admin:hunter2@10.0.0.1:8000/v1",
        1.0,
        PoolConfig(),
        BreakerConfig(),
        transport=httpx.MockTransport(lambda request: httpx.Response(503)),
    )
    with pytest.raises(UpstreamStartError) as caught:
        await discover([upstream], wait=0)
    assert "10.0.0.1:8000" in str(caught.value) and "hunter2" not in str(caught.value)
    await upstream.close()


async def test_while_a_429_keeps_the_only_upstream_out_every_refusal_says_when_to_return() -> None:
    """One 429 with `Retry-After: 40` from the pool's only upstream: the requests after it are
    refused without reaching it, each with a `Retry-After` of the time left (never more than
    what it asked, never 0), not a bare 503."""
    fake = FakeUpstreamCompletions(429)
    fake.retry_after = "40"
    engine = _engine(fake)
    with pytest.raises(RateLimitError) as limited:
        await _steps(engine)
    assert limited.value.headers["retry-after"] == "40"
    for _ in range(2):
        with pytest.raises(EngineUnavailableError) as refused:
            await _steps(engine)
        assert 1 <= int(refused.value.headers["retry-after"]) <= 40
    assert int(refused.value.headers["retry-after"]) >= 30, "a stall of 10 s is not expected"
    assert fake.requests == 1
    await engine.shutdown()


async def test_while_the_only_upstreams_breaker_is_open_refusals_say_when_it_opens() -> None:
    fake = FakeUpstreamCompletions(0)
    engine = _engine(fake, failures=1, open_seconds=3600)
    with pytest.raises(BadGatewayError):
        await _steps(engine)
    with pytest.raises(EngineUnavailableError) as refused:
        await _steps(engine)
    assert 3500 <= int(refused.value.headers["retry-after"]) <= 3600
    assert fake.requests == 1
    await engine.shutdown()


async def test_the_refusals_retry_after_reaches_the_client_over_http() -> None:
    """The same through the real app on loopback: after the upstream's 429 (passed on with its
    Retry-After), the next request is a 503 in OpenAI's envelope with the time left."""
    from tests.support.fakes import FAKE_MODEL, fake_app, serve_in_thread

    fake = FakeUpstreamCompletions(429)
    fake.retry_after = "40"
    engine = _engine(fake)
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with serve_in_thread(fake_app(engine)) as url:  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            limited = await http.post("/v1/chat/completions", json=body)
            refused = await http.post("/v1/chat/completions", json=body)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "40"
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "engine_unavailable"
    assert 30 <= int(refused.headers["retry-after"]) <= 40
    assert fake.requests == 1
