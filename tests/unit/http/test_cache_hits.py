"""Cache hits answered before routing (`http.cache_hits`), through the real app over the fake
engine on loopback: what the middleware answers from a remembered body, and what it must leave
to the route, which knows more about the caller than the remembered answer does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, greedy_chat, serve_in_thread
from tests.support.replicas import auth, create_key, replica


@pytest.fixture
def shared_cache() -> Iterator[str]:
    """Managed keys, and one cache for all of them (so the remembered body is every key's)."""
    prefix = f"hits-{uuid.uuid4().hex[:8]}"
    app = replica(prefix, cache_policy="deterministic", cache_shared_across_keys=True)
    with serve_in_thread(app) as url:
        yield url


def post(url: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json=greedy_chat(), headers=auth(key), timeout=10
    )


def test_a_key_limited_to_other_models_is_not_answered_from_the_cache(
    shared_cache: str,
) -> None:
    url = shared_cache
    anyone = create_key(url)["key"]
    elsewhere = create_key(url, models=["another-model"])["key"]
    here = create_key(url, models=[FAKE_MODEL])["key"]
    first, again = post(url, anyone), post(url, anyone)
    assert (first.status_code, first.headers["x-cache"]) == (200, "MISS")
    assert again.headers["x-cache"] == "HIT"  # the body is remembered now
    refused = post(url, elsewhere)
    assert refused.status_code != 200, "a key was served the answer of a model it may not use"
    assert "x-cache" not in refused.headers
    assert refused.json()["error"]["param"] == "model", refused.text
    # A key allowed the model gets the entry (from the route, which checked its list).
    allowed = post(url, here)
    assert (allowed.status_code, allowed.headers["x-cache"]) == (200, "HIT")
