"""`wire.reasoning_seal`: thinking signatures and sealed reasoning, made and checked under the
gateway's keys; anything else refused."""

from __future__ import annotations

import hashlib

import pytest

from sluicegate.wire.reasoning_seal import (
    MIN_KEY_BYTES,
    SEAL_PREFIX,
    SIGNATURE_PREFIX,
    ReasoningSeal,
    SealError,
    text_digest,
)

KEY, OTHER = b"k" * MIN_KEY_BYTES, b"o" * MIN_KEY_BYTES


def test_a_signature_verifies_for_its_text_only() -> None:
    seal = ReasoningSeal([KEY])
    signature = seal.sign("The user wants a capital. Paris.")
    assert signature.startswith(SIGNATURE_PREFIX)
    assert seal.verify("The user wants a capital. Paris.", signature)
    assert not seal.verify("The user wants a capital. Rome.", signature)
    assert not seal.verify("The user wants a capital. Paris. ", signature)


def test_a_signature_depends_on_the_text_alone() -> None:
    """A cache hit or a replay signs as the live answer did."""
    assert ReasoningSeal([KEY]).sign("same") == ReasoningSeal([KEY]).sign("same")


def test_a_running_digest_signs_as_the_whole_text() -> None:
    """A stream signs from the sha256 of its deltas, without keeping the text."""
    seal = ReasoningSeal([KEY])
    running = hashlib.sha256()
    for part in ["Le", "t me th", "ink — ", "😀"]:
        running.update(part.encode())
    assert seal.sign_digest(running.digest()) == seal.sign("Let me think — 😀")
    assert text_digest("Let me think — 😀") == running.digest()


@pytest.mark.parametrize(
    "forged",
    [
        None,
        "",
        42,
        "sg1.",
        "sg1.not base64 !!",
        "sg2." + "A" * 43,
        "EqQBCkgIBhABGAIiQH",  # the shape of Anthropic's own signatures
    ],
)
def test_anything_but_a_signature_of_this_gateway_is_refused(forged: object) -> None:
    assert not ReasoningSeal([KEY]).verify("text", forged)


def test_a_signature_under_another_key_is_refused() -> None:
    signature = ReasoningSeal([OTHER]).sign("text")
    assert not ReasoningSeal([KEY]).verify("text", signature)


def test_earlier_keys_still_verify_and_open_after_a_rotation() -> None:
    before = ReasoningSeal([KEY])
    signature, token = before.sign("text"), before.seal("text")
    after = ReasoningSeal([OTHER, KEY])
    assert after.verify("text", signature)
    assert after.open(token) == "text"
    # What it makes now is under the new key only.
    assert not before.verify("text", after.sign("text"))
    with pytest.raises(SealError):
        before.open(after.seal("text"))


def test_sealed_text_opens_to_itself_and_is_not_readable() -> None:
    seal = ReasoningSeal([KEY])
    text = "a private thought, é 😀 \u2028"
    token = seal.seal(text)
    assert token.startswith(SEAL_PREFIX)
    assert "private" not in token
    assert seal.open(token) == text
    assert seal.seal(text) != token  # a fresh nonce each time


@pytest.mark.parametrize(
    "token",
    [None, "", "se1.", "se1.AAAA", "gAAAAABpXyz-openai-encrypted", "se1.!!!!"],
)
def test_opening_what_the_gateway_did_not_seal_fails(token: object) -> None:
    with pytest.raises(SealError):
        ReasoningSeal([KEY]).open(token)


def test_a_tampered_seal_fails_to_open() -> None:
    seal = ReasoningSeal([KEY])
    token = seal.seal("text")
    body = token[len(SEAL_PREFIX) :]
    flipped = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    with pytest.raises(SealError):
        seal.open(SEAL_PREFIX + flipped)


def test_short_or_missing_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        ReasoningSeal([b"short"])
    with pytest.raises(ValueError, match="at least one key"):
        ReasoningSeal([])
