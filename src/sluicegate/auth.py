"""API keys: parsing `SLUICEGATE_API_KEYS`, checking bearer tokens, and the ASGI guard.

Only SHA-256 digests of keys are kept in memory. A presented token is hashed and compared
with every stored digest by `hmac.compare_digest`, without stopping at the first match, so
timing says nothing about which key (or how much of one) matched. Each key has a public id,
`key-` plus the first 12 hex digits of its digest, for logs and metric labels; the key itself
is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import AuthenticationError
from sluicegate.middleware import send_error

HASH_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class ApiKeyError(ValueError):
    """`SLUICEGATE_API_KEYS` cannot be used; the message says why, never the key."""


def key_id(digest: bytes) -> str:
    return "key-" + digest.hex()[:12]


@dataclass(frozen=True, slots=True)
class ApiKeyring:
    digests: tuple[bytes, ...]

    @classmethod
    def parse(cls, value: str) -> ApiKeyring:
        """Keys from a comma-separated list, or from a file given as `@path` (one per line,
        `#` comments). Each entry is a key, or `sha256:<hex digest>` of one."""
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise ApiKeyError(f"cannot read the API key file {path}: {exc.strerror}") from None
            entries: Iterable[str] = (line.split("#", 1)[0] for line in text.splitlines())
        else:
            entries = value.split(",")
        digests = tuple(_digest(entry.strip()) for entry in entries if entry.strip())
        if not digests:
            raise ApiKeyError("no API keys given")
        return cls(digests)

    def identify(self, token: str) -> str | None:
        """The public id of the key `token`, or None if it is not one of ours."""
        presented = hashlib.sha256(token.encode()).digest()
        found: bytes | None = None
        for digest in self.digests:
            if hmac.compare_digest(presented, digest):
                found = digest
        return None if found is None else key_id(found)


def _digest(entry: str) -> bytes:
    if entry.startswith(HASH_PREFIX):
        hex_digest = entry[len(HASH_PREFIX) :]
        if not _HEX_DIGEST.fullmatch(hex_digest):
            raise ApiKeyError("a sha256: entry must be followed by 64 hex digits")
        return bytes.fromhex(hex_digest)
    return hashlib.sha256(entry.encode()).digest()


class ApiKeyMiddleware:
    """Refuse requests without a valid bearer key, except on the open paths.

    Every refusal is the same 401, whether the header was absent, malformed or wrong. The
    key's public id goes to `request.state.api_key_id`.
    """

    def __init__(self, app: ASGIApp, keyring: ApiKeyring, open_paths: frozenset[str]):
        self.app = app
        self.keyring = keyring
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        key = self.keyring.identify(_bearer_token(scope))
        if key is None:
            await send_error(send, AuthenticationError(headers={"www-authenticate": "Bearer"}))
            return
        scope.setdefault("state", {})["api_key_id"] = key
        await self.app(scope, receive, send)


def _bearer_token(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""
