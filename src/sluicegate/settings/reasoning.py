"""Reasoning that comes back: the keys that sign thinking blocks (the Messages API) and seal
reasoning items (the Responses API's `encrypted_content`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator

from sluicegate.wire.reasoning_seal import MIN_KEY_BYTES


def key_bytes(value: str) -> bytes:
    """A key as given: its text, or with `@path` the file's content (stripped)."""
    if value.startswith("@"):
        try:
            value = Path(value[1:]).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the key file: {exc.__class__.__name__}") from None
    raw = value.encode("utf-8")
    if len(raw) < MIN_KEY_BYTES:
        raise ValueError(f"a reasoning key has at least {MIN_KEY_BYTES} bytes")
    return raw


class ReasoningSettings(BaseModel):
    """The keys thoughts are signed and sealed with."""

    reasoning_key: SecretStr | None = Field(
        default=None,
        description=f"Key (at least {MIN_KEY_BYTES} bytes, or @file) that signs the thinking "
        "blocks of Messages answers and seals the Responses API's `encrypted_content`, so that "
        "thoughts a client sends back are known to be the gateway's (a forged signature is a "
        "400). Give every replica the same key. Unset: one key made at start, shared by the "
        "workers, or with REDIS_URL made once in Redis and shared by every replica; without "
        "Redis a restart makes earlier signatures invalid (docs/agents.md).",
    )
    reasoning_previous_keys: SecretStr | None = Field(
        default=None,
        description="Comma-separated earlier keys (or @file, one per line), still accepted for "
        "checking signatures and opening sealed reasoning while clients hold them: a key is "
        "rotated by moving it here.",
    )

    @field_validator("reasoning_key")
    @classmethod
    def _key_checked(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            key_bytes(value.get_secret_value())
        return value

    @field_validator("reasoning_previous_keys")
    @classmethod
    def _previous_checked(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            previous_keys(value.get_secret_value())
        return value

    def configured_reasoning_key(self) -> bytes | None:
        """`REASONING_KEY`'s bytes, or None when it is not set."""
        key = self.reasoning_key
        return None if key is None else key_bytes(key.get_secret_value())

    def earlier_reasoning_keys(self) -> tuple[bytes, ...]:
        """`REASONING_PREVIOUS_KEYS`' bytes, in the order given."""
        keys = self.reasoning_previous_keys
        return () if keys is None else tuple(previous_keys(keys.get_secret_value()))


def previous_keys(value: str) -> list[bytes]:
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the key file: {exc.__class__.__name__}") from None
        entries = text.splitlines()
    else:
        entries = value.split(",")
    return [key_bytes(entry.strip()) for entry in entries if entry.strip()]
