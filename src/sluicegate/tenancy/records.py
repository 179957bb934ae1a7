"""A managed key as it is stored (`KeyRecord`: its digest and settings, never the key), as the
request path reads it (`KeyPolicy`), and as the admin API shows it (`view`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from sluicegate.keys import KeyBudget, KeyPolicy
from sluicegate.prices import nanos
from sluicegate.wire.admin_keys import (
    FIRST_SECOND,
    LAST_SECOND,
    Amount,
    BudgetSpec,
    KeySettings,
    ModelName,
    Priority,
)

SETTINGS = ("name", "models", "rpm", "tpm", "priority", "budget", "expires_at", "metadata")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    digest: bytes
    """SHA-256 of the key: what a presented key is matched by."""
    settings: dict[str, Any]
    """`KeySettings` as JSON (`expires_at` in Unix seconds)."""
    created_at: int
    updated_at: int

    @classmethod
    def new(cls, key_id: str, digest: bytes, settings: KeySettings, now: int) -> KeyRecord:
        return cls(key_id, digest, stored(settings), now, now)

    def changed(self, changes: KeySettings, now: int) -> KeyRecord:
        """This record with the settings `changes` gives (`KeyUpdate`) replaced."""
        merged = {**self.settings, **stored(changes, only_set=True)}
        return KeyRecord(self.id, self.digest, merged, self.created_at, now)

    def dumps(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "digest": self.digest.hex(),
                "settings": self.settings,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
            }
        )

    @classmethod
    def loads(cls, raw: bytes | str) -> KeyRecord:
        data = orjson.loads(raw)
        return cls(
            data["id"],
            bytes.fromhex(data["digest"]),
            dict(data["settings"]),
            int(data["created_at"]),
            int(data["updated_at"]),
        )

    def policy(self) -> KeyPolicy:
        """The settings the request path applies. Raises `ValueError` when they are out of
        the API's bounds (a record written around it, by hand or by an older version)."""
        s = _Applied.model_validate(self.settings)
        return KeyPolicy(
            requests_per_minute=s.rpm,
            tokens_per_minute=s.tpm,
            priority=s.priority,
            models=None if s.models is None else frozenset(s.models),
            budget=_budget(s.budget),
            expires_at=s.expires_at,
        )

    def view(self) -> dict[str, Any]:
        """The key in the admin API: its id and settings, never its secret nor digest."""
        return {
            "id": self.id,
            "object": "api_key",
            "source": "managed",
            **{name: self.settings.get(name) for name in SETTINGS},
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def static_view(key_id: str, admin: bool) -> dict[str, Any]:
    """A key of `SLUICEGATE_API_KEYS` (or `ADMIN_API_KEYS`): listed, read-only."""
    return {
        "id": key_id,
        "object": "api_key",
        "source": "admin_settings" if admin else "settings",
        **{name: None for name in SETTINGS},
        "created_at": None,
        "updated_at": None,
    }


def stored(settings: KeySettings, only_set: bool = False) -> dict[str, Any]:
    """The settings as they are stored: JSON, `expires_at` in Unix seconds."""
    data = settings.model_dump(
        mode="json", exclude_unset=only_set, exclude={"expires_at", "budget"}
    )
    if not only_set or "expires_at" in settings.model_fields_set:
        expires: datetime | None = settings.expires_at
        data["expires_at"] = None if expires is None else int(expires.timestamp())
    if not only_set or "budget" in settings.model_fields_set:
        data["budget"] = (
            None if settings.budget is None else settings.budget.model_dump(exclude_none=True)
        )
    return data


class _Applied(BaseModel):
    """The stored settings the request path applies, held to the API's bounds (`KeySettings`'
    types); fields it does not apply, or does not know (a newer version's), are left."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    rpm: Amount | None = None
    tpm: Amount | None = None
    priority: Priority | None = None
    models: list[ModelName] | None = None
    budget: BudgetSpec | None = None
    expires_at: Annotated[float, Field(ge=FIRST_SECOND, le=LAST_SECOND)] | None = None


def _budget(spec: BudgetSpec | None) -> KeyBudget | None:
    if spec is None:
        return None
    if spec.tokens is not None:
        return KeyBudget(spec.tokens, "tokens", spec.period)
    assert spec.cost is not None  # one of the two: `BudgetSpec`
    return KeyBudget(nanos(spec.cost), "cost", spec.period)
