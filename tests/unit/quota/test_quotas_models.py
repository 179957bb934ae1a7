"""A model's own limits across every key (`rate_limit` in the models file), on the in-process
limiter: counted with the key's, given back when the key refuses, settled for what ran."""

from __future__ import annotations

import pytest

from sluicegate.errors import KeyRateLimitError, RateLimitError
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.quotas import ModelQuota, Quotas
from sluicegate.quota.window import RateLimit

MODEL = ModelQuota("llama", RateLimit(requests_per_minute=2, tokens_per_minute=1000))


async def test_a_models_limit_is_shared_by_every_key() -> None:
    quotas = Quotas(MemoryRateLimiter())
    await quotas.reserve("key-a", 10, 1, 10, model=MODEL)
    await quotas.reserve("key-b", 10, 1, 10, model=MODEL)
    with pytest.raises(RateLimitError) as caught:
        await quotas.reserve("key-c", 10, 1, 10, model=MODEL)
    # The model's refusal, not the key's: another model may take the request.
    assert not isinstance(caught.value, KeyRateLimitError)
    assert "on the model llama" in caught.value.message
    assert caught.value.headers["retry-after"]


async def test_a_keys_refusal_is_a_key_rate_limit_and_gives_the_model_its_tokens_back() -> None:
    limiter = MemoryRateLimiter()
    quotas = Quotas(
        limiter, default=RateLimit(tokens_per_minute=100), overrides={"key-b": RateLimit()}
    )
    await quotas.reserve("key-a", 50, 1, 40, model=MODEL)
    with pytest.raises(KeyRateLimitError):
        await quotas.reserve("key-a", 50, 1, 40, model=MODEL)
    # The model holds the first request's 90 tokens only: 900 of its 1000 are left.
    fits = ModelQuota("llama", RateLimit(tokens_per_minute=1000))
    await quotas.reserve("key-b", 800, 1, 100, model=fits)


async def test_what_a_request_did_not_use_goes_back_to_the_model() -> None:
    quotas = Quotas(MemoryRateLimiter())
    model = ModelQuota("m", RateLimit(tokens_per_minute=300))
    held = await quotas.reserve("key-a", 100, 1, 200, model=model)
    await quotas.release(held, 0, 100)  # read its prompt, produced nothing: 200 go back
    await quotas.reserve("key-b", 100, 1, 100, model=model)


async def test_a_request_larger_than_the_models_whole_limit_is_refused_at_once() -> None:
    quotas = Quotas(MemoryRateLimiter())
    model = ModelQuota("m", RateLimit(tokens_per_minute=100))
    with pytest.raises(RateLimitError, match="the model m's limit of 100 tokens"):
        await quotas.reserve("key-a", 50, 1, 80, model=model)
