"""Managed keys when what Redis holds is not what the admin API wrote, or is gone: a record out
of bounds or unreadable, a change log entry of no key, a Redis restarted empty. Over replicas
of the real app (a fake engine each) and a real Redis."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest
import redis

from sluicegate.keys import digest_of, key_id
from sluicegate.tenancy.records import KeyRecord
from tests.support.fakes import serve_in_thread
from tests.support.metrics import local_value
from tests.support.redis_server import running_redis, shared_redis_url
from tests.support.replicas import (
    ADMIN,
    auth,
    chat,
    create_key,
    known_on,
    replica,
    two_replicas,
    until,
)

PLANTED = "sk-sg-planted-around-the-admin-api"
SKIPPED = "sluicegate_managed_key_records_skipped_total"
LOST = "sluicegate_managed_keys_store_lost_total"
SYNC_ERRORS = "sluicegate_managed_keys_sync_errors_total"


def _plant(url: str, prefix: str, settings: dict[str, object]) -> str:
    """A key record written straight into Redis, as the admin API's script would (the hash and
    the change log), with `settings` the API would refuse; its id."""
    digest = digest_of(PLANTED)
    now = int(time.time())
    record = KeyRecord(key_id(digest), digest, settings, now, now)
    client = redis.Redis.from_url(url)
    client.hset(f"{prefix}:keys", record.id, record.dumps())
    client.xadd(f"{prefix}:keys:log", {"id": record.id})
    client.close()
    return record.id


def test_a_record_that_cannot_be_applied_is_skipped_and_revocations_go_on(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cost budget of 1e300 (nano-units past any integer a float holds) once stopped every
    process's follower for good: no revocation was applied after it."""
    caplog.set_level(logging.ERROR)
    skipped, errors = local_value(SKIPPED), local_value(SYNC_ERRORS)
    with two_replicas(prefix) as (a, b):
        first = create_key(a, name="before")
        known_on(b, first["key"])
        bad = _plant(shared_redis_url(), prefix, {"budget": {"cost": 1e300, "period": "month"}})
        client = redis.Redis.from_url(shared_redis_url())
        client.xadd(f"{prefix}:keys:log", {"not-an-id": "x"})  # an entry naming no key
        client.close()
        second = create_key(a, name="after")
        known_on(b, second["key"])
        httpx.delete(f"{a}/admin/keys/{first['id']}", headers=auth(ADMIN))
        until(401, lambda: chat(b, first["key"]))
        for url in (a, b):
            assert chat(url, PLANTED).status_code == 401
            assert chat(url, second["key"]).status_code == 200
    assert local_value(SKIPPED) > skipped
    assert local_value(SYNC_ERRORS) > errors  # the entry of no key: reloaded whole
    assert f"the record of the key {bad} in redis cannot be applied" in caplog.text
    assert "budget.cost" in caplog.text


def test_a_process_starts_beside_a_record_it_cannot_apply(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """And refuses that key, whatever is wrong with it, while the others work."""
    caplog.set_level(logging.ERROR)
    with serve_in_thread(replica(prefix)) as a:
        good = create_key(a, rpm=100)
    for settings in (
        {"budget": {"cost": 1e300, "period": "month"}},  # start-up once failed on it
        {"rpm": 1e300},
        {"tpm": "many"},
        {"expires_at": 1e300},
    ):
        _plant(shared_redis_url(), prefix, settings)
        skipped = local_value(SKIPPED)
        with serve_in_thread(replica(prefix)) as url:
            assert chat(url, good["key"]).status_code == 200
            assert chat(url, PLANTED).status_code == 401
        assert local_value(SKIPPED) > skipped, settings
    assert "cannot be applied" in caplog.text


def test_a_record_written_by_hand_out_of_bounds_is_fixed_by_a_patch(prefix: str) -> None:
    """The update compares and sets what Redis holds, as written: a record's JSON dumped
    again differs from one written by hand, and every PATCH of it once answered 503."""
    digest = digest_of(PLANTED)
    now = int(time.time())
    settings = {"tpm": 1e300, "name": "by hand"}
    record = {"id": key_id(digest), "digest": digest.hex(), "settings": settings,
              "created_at": now, "updated_at": now}  # fmt: skip
    client = redis.Redis.from_url(shared_redis_url())
    client.hset(f"{prefix}:keys", key_id(digest), json.dumps(record, indent=1))
    client.close()
    with serve_in_thread(replica(prefix)) as url:
        assert chat(url, PLANTED).status_code == 401
        fixed = httpx.patch(
            f"{url}/admin/keys/{key_id(digest)}", json={"tpm": 100000}, headers=auth(ADMIN)
        )
        assert fixed.status_code == 200, fixed.text
        assert fixed.json()["tpm"] == 100000 and fixed.json()["name"] == "by hand"
        assert chat(url, PLANTED).status_code == 200


def test_keys_outlive_a_redis_restarted_empty_and_are_restored_from_a_copy(
    prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis without persistence restarts with no key: every process keeps its copy (an empty
    hash is lost data, not every key revoked), logs it, counts it, and can write it back."""
    caplog.set_level(logging.WARNING)
    with (
        running_redis(tmp_path) as server,
        serve_in_thread(replica(prefix, server.url)) as url,
    ):
        made = [create_key(url, name=f"kept-{i}", rpm=1000) for i in range(3)]
        refused = httpx.post(f"{url}/admin/keys/restore", headers=auth(ADMIN))
        assert refused.status_code == 400  # nothing is lost
        lost = local_value(LOST)
        server.kill()
        while "managed keys: redis does not answer" not in caplog.text:
            time.sleep(0.05)  # the follower's read fails: it reloads whole once redis answers
        server.start()  # the same port, nothing in it
        while local_value(LOST) == lost:
            time.sleep(0.05)  # that reload (pytest's timeout bounds one that never comes)
        for key in made:
            assert chat(url, key["key"]).status_code == 200
        assert "taken as lost data" in caplog.text
        # Written back from the copy: in Redis again, for every replica, a new one too.
        restored = httpx.post(f"{url}/admin/keys/restore", headers=auth(ADMIN))
        assert restored.status_code == 200
        assert sorted(k["id"] for k in restored.json()["data"]) == sorted(k["id"] for k in made)
        assert all("key" not in k for k in restored.json()["data"])  # no secret, ever
        assert made[0]["key"] not in restored.text
        with serve_in_thread(replica(prefix, server.url)) as other:
            for key in made:
                assert chat(other, key["key"]).status_code == 200


def test_while_the_keys_are_kept_none_is_written_and_a_kept_one_can_be_revoked(
    prefix: str, tmp_path: Path
) -> None:
    """A key created after Redis lost its keys once ended their keeping everywhere (the next
    reload found one key and took it for all), and a leaked kept key could not be revoked
    (404, while it kept working): creating and changing keys are refused (409) until a
    restore, and deleting a kept key revokes it for good."""
    with (
        running_redis(tmp_path) as server,
        serve_in_thread(replica(prefix, server.url)) as url,
    ):
        leaked, *made = [create_key(url, name=f"kept-{i}") for i in range(3)]
        lost = local_value(LOST)
        server.kill()
        until(503, lambda: httpx.post(f"{url}/admin/keys", json={}, headers=auth(ADMIN)))
        server.start()  # the same port, nothing in it
        while local_value(LOST) == lost:
            time.sleep(0.05)  # the whole reload (pytest's timeout bounds one that never comes)
        refused = httpx.post(f"{url}/admin/keys", json={"name": "new"}, headers=auth(ADMIN))
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "managed_keys_lost"
        assert "/admin/keys/restore" in error["message"]
        changed = httpx.patch(
            f"{url}/admin/keys/{made[0]['id']}", json={"rpm": 5}, headers=auth(ADMIN)
        )
        assert changed.status_code == 409, changed.text
        for key in (leaked, *made):
            assert chat(url, key["key"]).status_code == 200
        revoked = httpx.delete(f"{url}/admin/keys/{leaked['id']}", headers=auth(ADMIN))
        assert revoked.status_code == 200, revoked.text
        assert chat(url, leaked["key"]).status_code == 401
        restored = httpx.post(f"{url}/admin/keys/restore", headers=auth(ADMIN))
        assert restored.status_code == 200, restored.text
        assert sorted(k["id"] for k in restored.json()["data"]) == sorted(k["id"] for k in made)
        create_key(url, name="after the restore")
        with serve_in_thread(replica(prefix, server.url)) as other:
            assert chat(other, leaked["key"]).status_code == 401
            for key in made:
                assert chat(other, key["key"]).status_code == 200
