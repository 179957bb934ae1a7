"""Costs are charged for what a request used, however it ended (fake engine, real HTTP).

Every test here runs one key at 60 tokens per minute (one token a second comes back), with a
fake engine whose first ten words come at once and the next after five seconds. The prompt
("user a b c") is 4 tokens; `max_tokens=30` reserves 30 more when the request is admitted.
A request cut after its ten words must leave 4 + 10 tokens charged, no more and no less.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from sluicegate.errors import EngineUnavailableError
from sluicegate.quota.quotas import Quotas, Reservation
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

TPM = 60
PROMPT = 4
PRODUCED = 10
WORDS = [f" w{i}" for i in range(30)]


def chat(**extra: object) -> dict[str, object]:
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "a b c"}]}
    return {**body, "max_tokens": 30, **extra}


def slow_after_ten(**extra: object) -> FakeEngine:
    return FakeEngine(words=WORDS, delays=[0.0] * PRODUCED + [5.0] * 20, **extra)  # type: ignore[arg-type]


@pytest.fixture
def served() -> Iterator[tuple[str, FakeEngine]]:
    engine = slow_after_ten()
    app = fake_app(
        engine, rate_limit_tokens_per_minute=TPM, request_timeout=30, stream_stall_timeout=30
    )
    with serve_in_thread(app) as url:
        yield url, engine


_released: list[int] = []
"""The completion tokens of each settlement made (`Quotas.release`) in the running test."""


@pytest.fixture(autouse=True)
def settlements(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Note each settlement once it is done, so that a test waits for it rather than for a
    sleep long enough (0.2 s, which a loaded machine could outlast)."""
    original = Quotas.release

    async def noted(
        self: Quotas, reservation: Reservation, completion_tokens: int, prompt_tokens: int = 0
    ) -> None:
        await original(self, reservation, completion_tokens, prompt_tokens)
        _released.append(completion_tokens)

    monkeypatch.setattr(Quotas, "release", noted)
    _released.clear()
    yield
    _released.clear()


def wait_idle(engine: FakeEngine) -> None:
    """Until the engine request is aborted and its reservation settled."""
    deadline = time.monotonic() + 10
    while engine.active or not _released:  # settled as the run's generator closes
        assert time.monotonic() < deadline, (
            f"in 10 s: {len(engine.active)} engine requests still active, "
            f"{len(_released)} settlements"
        )
        time.sleep(0.01)


def remaining_after(url: str) -> int:
    """Tokens left once the next request (4 prompt tokens + 1 reserved) is admitted."""
    response = httpx.post(f"{url}/v1/chat/completions", json=chat(max_tokens=1), timeout=10)
    assert response.status_code == 200, response.text
    return int(response.headers["x-ratelimit-remaining-tokens"])


def assert_charged_what_was_used(remaining: int) -> None:
    # 60 - (4 + 10 used) - (4 + 1 reserved by the probe) = 41, plus a token or two that
    # came back while the test ran. Without the settlement the ten tokens are missing (51);
    # without the refund the whole reservation stays (60 - 34 - 5 = 21).
    assert 41 <= remaining <= 43, remaining


def test_an_abandoned_stream_is_charged_its_tokens(served: tuple[str, FakeEngine]) -> None:
    url, engine = served
    seen = 0
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=chat(stream=True)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["x-ratelimit-remaining-tokens"] == str(TPM - PROMPT - 30)
        for line in response.iter_lines():
            seen += '"content":" w' in line
            if seen == PRODUCED:
                break
    wait_idle(engine)
    assert_charged_what_was_used(remaining_after(url))


def test_a_non_streamed_request_whose_client_left_is_charged(
    served: tuple[str, FakeEngine],
) -> None:
    url, engine = served
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=chat(), timeout=0.5)
    wait_idle(engine)
    assert_charged_what_was_used(remaining_after(url))


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_past_its_time_limit_is_charged(stream: bool) -> None:
    engine = slow_after_ten()
    app = fake_app(engine, rate_limit_tokens_per_minute=TPM, request_timeout=0.5)
    with serve_in_thread(app) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(stream=stream), timeout=10)
        # A stream has sent its first events with a 200 and ends with an error event.
        assert response.status_code == (200 if stream else 504)
        assert "timeout" in response.text
        wait_idle(engine)
        assert_charged_what_was_used(remaining_after(url))


def test_a_stream_cut_by_an_engine_error_is_charged() -> None:
    engine = FakeEngine(words=WORDS, fail_after_words=PRODUCED)
    with serve_in_thread(fake_app(engine, rate_limit_tokens_per_minute=TPM)) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(stream=True), timeout=10)
        assert response.status_code == 200
        assert "engine_unavailable" in response.text
        wait_idle(engine)
        assert_charged_what_was_used(remaining_after(url))


def test_a_finished_request_gives_back_what_it_did_not_use() -> None:
    engine = FakeEngine(words=WORDS[:PRODUCED])
    with serve_in_thread(fake_app(engine, rate_limit_tokens_per_minute=TPM)) as url:
        first = httpx.post(f"{url}/v1/chat/completions", json=chat(), timeout=10)
        assert first.status_code == 200
        assert first.json()["usage"]["completion_tokens"] == PRODUCED
        # Admitted with its whole possible cost reserved.
        assert first.headers["x-ratelimit-remaining-tokens"] == str(TPM - PROMPT - 30)
        assert_charged_what_was_used(remaining_after(url))


def test_the_reservation_counts_every_prompt_and_choice() -> None:
    engine = FakeEngine(words=WORDS[:2])
    app = fake_app(engine, rate_limit_tokens_per_minute=1000)
    with serve_in_thread(app) as url:
        body = {"model": FAKE_MODEL, "prompt": ["a b", "c d e"], "n": 3, "max_tokens": 20}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
        assert response.status_code == 200
        # 5 prompt tokens + 2 prompts x 3 choices x 20 tokens.
        assert response.headers["x-ratelimit-remaining-tokens"] == str(1000 - 5 - 120)


def test_a_request_that_could_never_fit_is_refused_at_once() -> None:
    engine = FakeEngine()
    with serve_in_thread(fake_app(engine, rate_limit_tokens_per_minute=TPM)) as url:
        started = time.monotonic()
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(max_tokens=57), timeout=10)
        # At once (a few ms alone), not queued for tokens that can never come: 5 s is over
        # 5 times what it takes with both cores busy.
        took = time.monotonic() - started
        assert took < 5, f"a request that can never fit was answered after {took:.2f} s"
        assert response.status_code == 429
        error = response.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert error["param"] == "max_tokens"
        assert "61" in error["message"] and "60" in error["message"]
        assert engine.requests == []
        # Nothing was counted: a request that fits is admitted with the whole limit.
        fits = httpx.post(f"{url}/v1/chat/completions", json=chat(max_tokens=56), timeout=10)
        assert fits.status_code == 200
        assert fits.headers["x-ratelimit-remaining-tokens"] == "0"


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_the_engine_fails_before_its_first_token_is_charged_nothing(
    stream: bool,
) -> None:
    engine = FakeEngine(words=WORDS, fail_before_output=EngineUnavailableError())
    with serve_in_thread(fake_app(engine, rate_limit_tokens_per_minute=TPM)) as url:
        for _ in range(3):
            response = httpx.post(
                f"{url}/v1/chat/completions", json=chat(stream=stream), timeout=10
            )
            assert response.status_code == 503, response.text
        engine.fail_before_output = None
        # No prompt was read and nothing produced: the limit is whole but for the probe's
        # 4 + 1 (each failure's prompt kept would leave 12 fewer, a token a second back).
        assert remaining_after(url) == TPM - PROMPT - 1


def test_a_request_whose_client_left_before_the_first_token_is_charged_nothing() -> None:
    engine = FakeEngine(words=WORDS, delays=[5.0] * 30)
    with serve_in_thread(fake_app(engine, rate_limit_tokens_per_minute=TPM)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json=chat(), timeout=0.5)
        wait_idle(engine)
        engine.delays = None
        # The engine never answered it: the limit is whole but for the probe's 4 + 1.
        assert remaining_after(url) == TPM - PROMPT - 1
