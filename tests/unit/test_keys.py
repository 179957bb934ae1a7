"""The keyring with admin keys: each admin key is an API key too, and only they are admins."""

from __future__ import annotations

import hashlib

from sluicegate.keys import ApiKeyring, Caller, key_id

USER, ADMIN = "sk-user-1", "sk-admin-1"


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def test_admin_keys_are_api_keys_and_admins() -> None:
    ring = ApiKeyring.of(USER, f"sha256:{digest(ADMIN).hex()}")
    assert ring.caller(USER) == Caller(key_id(digest(USER)), admin=False)
    assert ring.caller(ADMIN) == Caller(key_id(digest(ADMIN)), admin=True)
    assert ring.caller("sk-other") is None and ring.caller("") is None
    assert ring.identify(ADMIN) == key_id(digest(ADMIN))


def test_a_key_in_both_lists_is_an_admin_once() -> None:
    ring = ApiKeyring.of(f"{USER},{ADMIN}", ADMIN)
    assert len(ring.digests) == 2
    caller = ring.caller(ADMIN)
    assert caller is not None and caller.admin


def test_admin_keys_alone_make_a_ring_of_admins() -> None:
    ring = ApiKeyring.of(None, ADMIN)
    caller = ring.caller(ADMIN)
    assert caller is not None and caller.admin
    assert ring.caller(USER) is None
