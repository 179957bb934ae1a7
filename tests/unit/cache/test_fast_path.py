"""The hit path's memo (`cache.fast_path`): which request bodies are taken for the same one (a
hit answered before routing serves the entry of the body that went the whole way), and what it
keeps. A body taken for another is a wrong answer served; these pin the fingerprint down."""

from __future__ import annotations

import json

from sluicegate.cache.fast_path import (
    MAX_FINGERPRINTED_BODY,
    MAX_REMEMBERED_BODY,
    MAX_SHAPES,
    FastPath,
    HitShape,
)
from sluicegate.wire.formats import CompletionFormat

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def dumped(body: object, **layout: object) -> bytes:
    return json.dumps(body, **layout).encode()  # type: ignore[arg-type]


def test_the_same_json_in_another_layout_has_the_same_fingerprint() -> None:
    memo = FastPath(enabled=True, per_key=False)
    compact = memo.fingerprint(CHAT, dumped(BODY, separators=(",", ":")), "k")
    reordered = dict(reversed(list(BODY.items())))
    assert compact is not None
    assert memo.fingerprint(CHAT, dumped(reordered, indent=4), "k") == compact
    assert memo.fingerprint(CHAT, dumped(BODY), "k") == compact


def test_any_other_value_path_or_key_namespace_is_another_fingerprint() -> None:
    memo = FastPath(enabled=True, per_key=True)
    base = memo.fingerprint(CHAT, dumped(BODY), "key-a")
    others = [
        memo.fingerprint(CHAT, dumped({**BODY, "max_tokens": 6}), "key-a"),
        memo.fingerprint(CHAT, dumped({**BODY, "max_tokens": "5"}), "key-a"),
        memo.fingerprint(CHAT, dumped({**BODY, "extra": None}), "key-a"),
        memo.fingerprint("/v1/completions", dumped(BODY), "key-a"),
        memo.fingerprint(CHAT, dumped(BODY), "key-b"),
    ]
    assert base is not None and None not in others
    assert len({base, *others}) == 6, "two different requests share a fingerprint"


def test_without_per_key_caching_keys_share_fingerprints() -> None:
    memo = FastPath(enabled=True, per_key=False)
    assert memo.fingerprint(CHAT, dumped(BODY), "key-a") == memo.fingerprint(
        CHAT, dumped(BODY), "key-b"
    )


def test_the_same_bytes_again_give_the_same_fingerprint_from_the_memo_or_not() -> None:
    memo = FastPath(enabled=True, per_key=True)
    small = dumped(BODY)
    large = dumped({**BODY, "messages": [{"role": "user", "content": "x" * MAX_REMEMBERED_BODY}]})
    for body in (small, large):
        first = memo.fingerprint(CHAT, body, "k")
        assert first is not None and memo.fingerprint(CHAT, body, "k") == first
    # A remembered body is remembered under its path and namespace too.
    assert memo.fingerprint(CHAT, small, "other") != memo.fingerprint(CHAT, small, "k")
    assert memo.fingerprint("/v1/completions", small, "k") != memo.fingerprint(CHAT, small, "k")


def test_bodies_it_does_not_take_have_no_fingerprint() -> None:
    memo = FastPath(enabled=True, per_key=False)
    deep = b"[" * 100_000 + b"]" * 100_000
    too_large = dumped({**BODY, "pad": "x" * MAX_FINGERPRINTED_BODY})
    for body in (b"not json", b"[1, 2]", b'"text"', b"", too_large, deep[:MAX_FINGERPRINTED_BODY]):
        assert memo.fingerprint(CHAT, body, "k") is None, body[:40]
    assert FastPath(enabled=False, per_key=False).fingerprint(CHAT, dumped(BODY), "k") is None


def shape(key: str) -> HitShape:
    return HitShape(key, "m", "id", CompletionFormat("cmpl-1", 0, "m", False), False, False, 3)


def test_a_noted_shape_is_found_by_its_fingerprint_within_the_bound() -> None:
    memo = FastPath(enabled=True, per_key=False)
    assert memo.shape("f-0") is None
    for i in range(MAX_SHAPES):
        memo.note(f"f-{i}", shape(f"entry-{i}"))
    found = memo.shape("f-0")  # now the most recently used
    assert found is not None and found.key == "entry-0"
    memo.note("f-new", shape("entry-new"))
    assert memo.shape("f-1") is None, "the memo outgrew its bound"
    assert memo.shape("f-0") is not None and memo.shape("f-new") is not None
