"""API keys: parsing `SLUICEGATE_API_KEYS` and matching bearer tokens in constant time.

Only SHA-256 digests of keys are kept in memory. A presented token is hashed and compared
with every stored digest by `hmac.compare_digest`, without stopping at the first match, so
timing says nothing about which key (or how much of one) matched. Each key has a public id,
`key-` plus the first 12 hex digits of its digest, for logs and metric labels; the key itself
is never logged. The ASGI guard that uses this is `http.auth`.

An empty token is no key: a request without one never matches, and `sha256:` plus the digest
of the empty string (what `printf '' | sha256sum` prints) is refused at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

HASH_PREFIX = "sha256:"
ANONYMOUS = "anonymous"
"""The key id of every request when the gateway has no API keys: they share its limits."""
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_EMPTY_DIGEST = hashlib.sha256(b"").digest()


Period = Literal["day", "month"]


@dataclass(frozen=True, slots=True)
class KeyBudget:
    """What a key may spend per period (UTC): tokens, or cost in nano-units of the prices'
    currency (`prices.Price`), so that sums stay exact."""

    limit: int
    unit: Literal["tokens", "cost"]
    period: Period


def utc_time(unix: float) -> str:
    """A Unix time as a key's messages and headers give it (an expiry, a budget's reset):
    `2026-12-05T00:00:00Z`."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """A managed key's own settings (`/admin/keys`); None fields fall back to the gateway's
    defaults."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    priority: int | None = None
    models: frozenset[str] | None = None
    """The models it may use; None: every model."""
    budget: KeyBudget | None = None
    expires_at: float | None = None
    """Unix time after which the key is refused."""

    def permits(self, *names: str) -> bool:
        """Whether the key may use a model known by any of `names` (the name asked for, an
        alias, and the model it resolves to)."""
        return self.models is None or any(name in self.models for name in names)


class ApiKeyError(ValueError):
    """`SLUICEGATE_API_KEYS` cannot be used; the message says why, never the key."""


def digest_of(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def key_id(digest: bytes) -> str:
    return "key-" + digest.hex()[:12]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request's key says it comes from."""

    key_id: str
    admin: bool = False
    policy: KeyPolicy | None = None
    """A managed key's settings; None for the keys of the settings."""
    scraper: bool = False
    """A key of `METRICS_API_KEYS`: it reads the metrics and nothing else."""

    @property
    def reads_metrics(self) -> bool:
        """Whether it may read the metrics and `/ready`'s detail when keys are managed."""
        return self.admin or self.scraper


@dataclass(frozen=True, slots=True)
class ApiKeyring:
    digests: tuple[bytes, ...]
    admin: frozenset[bytes] = frozenset()
    """The digests of admin keys (`SLUICEGATE_ADMIN_API_KEYS`), which are in `digests` too."""

    @classmethod
    def of(cls, keys: str | None, admin_keys: str | None) -> ApiKeyring:
        """The API keys and the admin keys (each given as `parse` takes them), on one ring."""
        ring = cls.parse(keys) if keys else cls(())
        admin = cls.parse(admin_keys).digests if admin_keys else ()
        digests = ring.digests + tuple(d for d in admin if d not in ring.digests)
        return cls(digests, frozenset(admin))

    @classmethod
    def parse(cls, value: str) -> ApiKeyring:
        """Keys from a comma-separated list, or from a file given as `@path`: one per line, and
        a line whose first non-blank character is `#` is a comment (a key may hold `#`). Each
        entry is a key, or `sha256:<hex digest>` of one."""
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            try:
                text = path.read_text()
            except OSError as exc:
                raise ApiKeyError(f"cannot read the API key file {path}: {exc.strerror}") from None
            entries: Iterable[str] = (
                line for line in text.splitlines() if not line.lstrip().startswith("#")
            )
        else:
            entries = value.split(",")
        digests = tuple(_digest(entry.strip()) for entry in entries if entry.strip())
        if not digests:
            raise ApiKeyError("no API keys given")
        return cls(digests)

    def identify(self, token: str) -> str | None:
        """The public id of the key `token`, or None if it is not one of ours."""
        caller = self.caller(token)
        return None if caller is None else caller.key_id

    def caller(self, token: str) -> Caller | None:
        """Who the key `token` is, or None if it is not one of ours."""
        if not token:  # no key given: whatever the ring holds, it is not a match
            return None
        return self.match(digest_of(token))

    def match(self, presented: bytes) -> Caller | None:
        """Who the key whose digest is `presented` is, or None."""
        found: bytes | None = None
        for digest in self.digests:
            if hmac.compare_digest(presented, digest):
                found = digest
        if found is None:
            return None
        return Caller(key_id(found), found in self.admin)


def _digest(entry: str) -> bytes:
    if entry.startswith(HASH_PREFIX):
        hex_digest = entry[len(HASH_PREFIX) :]
        if not _HEX_DIGEST.fullmatch(hex_digest):
            raise ApiKeyError("a sha256: entry must be followed by 64 hex digits")
        digest = bytes.fromhex(hex_digest)
        if digest == _EMPTY_DIGEST:
            raise ApiKeyError(
                "a sha256: entry is the digest of the empty string (a digest made without "
                "the key): it would let requests without a key in"
            )
        return digest
    return hashlib.sha256(entry.encode()).digest()
