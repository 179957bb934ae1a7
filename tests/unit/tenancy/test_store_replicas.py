"""Managed keys over two replicas of the real app (a fake engine each), sharing one real Redis:
`/admin/keys` on one replica, the key used on the other; models, limits, expiry, revocation,
who may call the admin API, and that no secret is ever shown twice or logged."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, fake_app, greedy_chat, serve_in_thread
from tests.support.redis_server import running_redis, shared_redis_url
from tests.support.replicas import (
    ADMIN,
    auth,
    chat,
    create_key,
    replica,
    two_replicas,
    until,
)

STATIC = "sk-static-for-keys"


@pytest.fixture
def replicas(prefix: str) -> Iterator[tuple[str, str]]:
    with two_replicas(prefix, api_keys=STATIC) as urls:
        yield urls


def test_a_key_made_on_one_replica_works_on_the_other_and_a_revocation_reaches_back(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    created = create_key(a, name="team-a")
    secret = created["key"]
    assert created["id"].startswith("key-") and secret.startswith("sk-sg-")
    assert created["name"] == "team-a" and created["source"] == "managed"
    assert chat(a, secret).status_code == 200  # the replica that made it knows it at once
    until(200, lambda: chat(b, secret))
    deleted = httpx.delete(f"{b}/admin/keys/{created['id']}", headers=auth(ADMIN))
    assert deleted.json() == {"id": created["id"], "object": "api_key", "deleted": True}
    until(401, lambda: chat(a, secret))
    refused = chat(b, secret)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    # The keys of the settings keep working beside the managed ones.
    assert chat(a, STATIC).status_code == 200


def test_the_secret_is_shown_once_and_never_listed_read_or_logged(
    replicas: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = replicas
    caplog.set_level(logging.DEBUG)
    created = create_key(a, name="quiet", metadata={"team": "x"})
    secret = created["key"]
    listed = httpx.get(f"{b}/admin/keys", headers=auth(ADMIN)).text
    one = httpx.get(f"{a}/admin/keys/{created['id']}", headers=auth(ADMIN))
    changed = httpx.patch(f"{a}/admin/keys/{created['id']}", json={"rpm": 10}, headers=auth(ADMIN))
    assert one.json()["metadata"] == {"team": "x"} and changed.json()["rpm"] == 10
    assert changed.json()["name"] == "quiet"  # what a PATCH leaves out stays
    chat(a, secret)
    for text in (listed, one.text, changed.text, caplog.text):
        assert secret not in text and secret[6:] not in text
    # The keys of the settings are listed, read-only, by id.
    static = [k for k in httpx.get(f"{a}/admin/keys", headers=auth(ADMIN)).json()["data"]]
    sources = {k["source"] for k in static}
    assert {"settings", "admin_settings", "managed"} <= sources
    static_id = next(k["id"] for k in static if k["source"] == "settings")
    refused = httpx.patch(f"{a}/admin/keys/{static_id}", json={"rpm": 1}, headers=auth(ADMIN))
    assert refused.status_code == 400 and "read-only" in refused.json()["error"]["message"]


def test_only_admin_keys_may_manage_keys(replicas: tuple[str, str]) -> None:
    a, _ = replicas
    managed = create_key(a)["key"]
    assert httpx.get(f"{a}/admin/keys").status_code == 401
    for key in (STATIC, managed):
        answer = httpx.get(f"{a}/admin/keys", headers=auth(key))
        assert answer.status_code == 403, key
        posted = httpx.post(f"{a}/admin/keys", json={}, headers=auth(key))
        assert posted.status_code == 403
    assert httpx.get(f"{a}/admin/usage", headers=auth(managed)).status_code == 403


def test_bad_settings_are_refused_with_the_field_named(replicas: tuple[str, str]) -> None:
    a, _ = replicas
    for body, field in (
        ({"budgte": {"tokens": 5, "period": "day"}}, "budgte"),
        ({"budget": {"tokens": 5, "cost": 1.0, "period": "day"}}, "budget"),
        ({"budget": {"tokens": 5, "period": "week"}}, "period"),
        ({"rpm": 0}, "rpm"),
        ({"priority": 5000}, "priority"),
        ({"expires_at": "soon"}, "expires_at"),
    ):
        answer = httpx.post(f"{a}/admin/keys", json=body, headers=auth(ADMIN))
        assert answer.status_code == 400, body
        assert field in answer.text, body
    missing = httpx.get(f"{a}/admin/keys/key-000000000000", headers=auth(ADMIN))
    assert missing.status_code == 404


def test_numbers_no_limit_or_budget_can_hold_are_refused_and_the_largest_taken(
    replicas: tuple[str, str],
) -> None:
    """A cost budget of 1e300 was once stored, and then no process could apply it."""
    a, b = replicas
    created = create_key(a, rpm=2**53, tpm=2**53, budget={"cost": 9007199, "period": "month"})
    assert created["rpm"] == 2**53 and created["budget"]["cost"] == 9007199
    until(200, lambda: chat(b, created["key"]))
    for body, field in (
        ({"budget": {"cost": 1e300, "period": "month"}}, "cost"),
        ({"budget": {"cost": 9007200, "period": "month"}}, "cost"),
        ({"budget": {"tokens": 2**53 + 1, "period": "day"}}, "tokens"),
        ({"rpm": 1e300}, "rpm"),
        ({"tpm": 2**53 + 1}, "tpm"),
    ):
        for answer in (
            httpx.post(f"{a}/admin/keys", json=body, headers=auth(ADMIN)),
            httpx.patch(f"{a}/admin/keys/{created['id']}", json=body, headers=auth(ADMIN)),
        ):
            assert answer.status_code == 400, (body, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and field in error["message"], body
    assert chat(b, created["key"]).status_code == 200  # its record still applies everywhere


def test_a_key_limited_to_models_finds_no_other(replicas: tuple[str, str]) -> None:
    a, _ = replicas
    secret = create_key(a, models=["another-model"])["key"]
    refused = chat(a, secret)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    listed = httpx.get(f"{a}/v1/models", headers=auth(secret)).json()["data"]
    assert listed == []
    allowed = create_key(a, models=[FAKE_MODEL])["key"]
    assert chat(a, allowed).status_code == 200
    assert [m["id"] for m in httpx.get(f"{a}/v1/models", headers=auth(allowed)).json()["data"]]


def test_an_expired_key_is_refused_saying_so(replicas: tuple[str, str]) -> None:
    a, b = replicas
    created = create_key(a, expires_at="2020-01-01T00:00:00Z")
    refused = chat(a, created["key"])
    assert refused.status_code == 401 and "expired at 2020-01-01T00:00:00Z" in refused.text
    fresh = create_key(a, expires_at=int(time.time()) + 3600)
    until(200, lambda: chat(b, fresh["key"]))
    httpx.patch(f"{a}/admin/keys/{fresh['id']}", json={"expires_at": 1}, headers=auth(ADMIN))
    until(401, lambda: chat(b, fresh["key"]))


def test_a_keys_own_requests_per_minute_hold_on_both_replicas(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    created = create_key(a, rpm=3)
    until(200, lambda: httpx.get(f"{b}/v1/models", headers=auth(created["key"])))
    statuses = [chat(url, created["key"]).status_code for url in (a, b, a, b)]
    assert statuses == [200, 200, 200, 429]


def test_with_redis_down_known_keys_work_and_changes_answer_503(
    prefix: str, tmp_path: Path
) -> None:
    with (
        running_redis(tmp_path) as server,
        serve_in_thread(replica(prefix, server.url, api_keys=STATIC)) as url,
    ):
        created = create_key(url, name="survivor")
        server.kill()
        assert chat(url, created["key"]).status_code == 200
        for answer in (
            httpx.post(f"{url}/admin/keys", json={}, headers=auth(ADMIN)),
            httpx.get(f"{url}/admin/keys", headers=auth(ADMIN)),
            httpx.delete(f"{url}/admin/keys/{created['id']}", headers=auth(ADMIN)),
        ):
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == "store_unavailable"
        assert chat(url, created["key"]).status_code == 200


def test_without_managed_keys_the_admin_routes_are_not_found(prefix: str) -> None:
    app = fake_app(redis_url=shared_redis_url(), redis_key_prefix=prefix, admin_api_keys=ADMIN)
    with serve_in_thread(app) as url:
        assert httpx.get(f"{url}/admin/keys", headers=auth(ADMIN)).status_code == 404


def test_a_cached_answer_is_not_a_way_around_a_keys_models(prefix: str) -> None:
    """Answers shared across keys: a request a key may not make gets its 404, not the answer
    another key's identical request left in the cache (nor through the cache's fast path)."""
    app = replica(prefix, cache_policy="deterministic", cache_shared_across_keys=True)
    with serve_in_thread(app) as url:
        free, limited = create_key(url)["key"], create_key(url, models=["other"])["key"]
        body = greedy_chat("cached for everyone")
        first = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(free))
        assert first.status_code == 200
        while (
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(free)).headers.get(
                "x-cache"
            )
            != "HIT"
        ):
            time.sleep(0.02)  # the entry is written after the first answer
        for _ in range(3):
            refused = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(limited))
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "model_not_found"
