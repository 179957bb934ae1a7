"""Thoughts that come back: signed thinking blocks and sealed reasoning items.

A client sends a model's earlier thoughts back on its next turn: Anthropic's Messages API as
`thinking` blocks with a `signature`, the Responses API as `reasoning` items that may carry
`encrypted_content`. What comes back is put into the prompt as the model's own reasoning, so
the gateway checks that it wrote it:

- `sign(text)`: a thinking block's `signature`, an HMAC-SHA256 over the text's digest under
  the gateway's key. `verify` accepts a signature made with the current key or any earlier one
  still listed (a key is rotated by moving it to the previous keys). The signature depends on
  the text alone, so a cache hit or a replay signs as the live answer did, and an agent may
  switch models within a conversation.
- `seal(text)` / `open(token)`: a reasoning item's `encrypted_content`, AES-256-GCM under a
  key derived from the gateway's, so the text travels with the client without being readable
  by it; `open` raises `SealError` for anything the gateway did not seal.

No I/O and no settings: `wiring.reasoning` makes the keys and hands a `ReasoningSeal` to the
routes through the app state.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SIGNATURE_PREFIX = "sg1."
SEAL_PREFIX = "se1."
_SIGNING = b"sluicegate/thinking/v1\0"
_SEALING = b"sluicegate/seal/v1"
_NONCE_BYTES = 12
MIN_KEY_BYTES = 32
"""The shortest key accepted (`REASONING_KEY`)."""


class SealError(ValueError):
    """What was given back is not something this gateway sealed (or its key is gone)."""


def text_digest(text: str) -> bytes:
    """The digest a signature covers: SHA-256 of the text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ReasoningSeal:
    """Signs and seals thoughts under `keys[0]`; verifies and opens under any of `keys`."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a reasoning seal needs at least one key")
        for key in keys:
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"a reasoning key has at least {MIN_KEY_BYTES} bytes")
        self._keys = tuple(keys)
        self._ciphers = tuple(
            AESGCM(hmac.new(key, _SEALING, hashlib.sha256).digest()) for key in self._keys
        )

    # ---- signatures (Messages' thinking blocks) ----------------------------------------

    def sign_digest(self, digest: bytes) -> str:
        """The signature of a text whose `text_digest` is `digest` (a stream keeps a running
        SHA-256 instead of the text)."""
        return SIGNATURE_PREFIX + _b64(self._mac(self._keys[0], digest))

    def sign(self, text: str) -> str:
        return self.sign_digest(text_digest(text))

    def verify_digest(self, digest: bytes, signature: object) -> bool:
        """Whether `signature` is this gateway's for the text of `digest`, under any key."""
        if not isinstance(signature, str) or not signature.startswith(SIGNATURE_PREFIX):
            return False
        try:
            given = _unb64(signature[len(SIGNATURE_PREFIX) :])
        except SealError:
            return False
        return any(hmac.compare_digest(self._mac(key, digest), given) for key in self._keys)

    def verify(self, text: str, signature: object) -> bool:
        return self.verify_digest(text_digest(text), signature)

    @staticmethod
    def _mac(key: bytes, digest: bytes) -> bytes:
        return hmac.new(key, _SIGNING + digest, hashlib.sha256).digest()

    # ---- sealed text (Responses' encrypted_content) ------------------------------------

    def seal(self, text: str) -> str:
        """`text`, encrypted and authenticated: only a gateway holding the key opens it."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[0].encrypt(nonce, text.encode("utf-8", "surrogatepass"), None)
        return SEAL_PREFIX + _b64(nonce + sealed)

    def open(self, token: object) -> str:
        """The text `seal` made `token` of; `SealError` for anything else."""
        if not isinstance(token, str) or not token.startswith(SEAL_PREFIX):
            raise SealError("not sealed by this gateway")
        raw = _unb64(token[len(SEAL_PREFIX) :])
        if len(raw) <= _NONCE_BYTES:
            raise SealError("not sealed by this gateway")
        nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        for cipher in self._ciphers:
            try:
                plain = cipher.decrypt(nonce, sealed, None)
            except InvalidTag:
                continue
            return plain.decode("utf-8", "surrogatepass")
        raise SealError("not sealed by this gateway, or sealed under a key it no longer holds")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise SealError("not sealed by this gateway") from None
