"""`/admin/keys` bodies: a managed key's settings as an admin sends them, and as the API shows
them (`key_view`). Unknown fields are refused (a misspelt `budget` must not pass unnoticed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

KEY_PRIORITY_BOUND = 1000
"""A key's priority is within ± this, as `KEY_PRIORITIES` ranks are."""
MAX_METADATA_BYTES = 4096
MAX_MODELS = 256

ModelName = Annotated[str, Field(min_length=1, max_length=256)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BudgetSpec(_Strict):
    """`{"tokens": N, "period": "day"}` or `{"cost": X, "period": "month"}`."""

    tokens: int | None = Field(default=None, ge=1)
    cost: float | None = Field(default=None, gt=0)
    period: Literal["day", "month"]

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetSpec:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("a budget gives either `tokens` or `cost`, not both nor neither")
        return self


class KeySettings(_Strict):
    """Every setting of a managed key; each may be left out (the gateway's default)."""

    name: Annotated[str, Field(max_length=256)] | None = None
    models: Annotated[list[ModelName], Field(max_length=MAX_MODELS)] | None = None
    """The models it may use (others are unknown to it, 404); None: every model."""
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    priority: int | None = Field(default=None, ge=-KEY_PRIORITY_BOUND, le=KEY_PRIORITY_BOUND)
    budget: BudgetSpec | None = None
    expires_at: datetime | None = None
    """ISO 8601 (UTC unless it says otherwise) or Unix seconds."""
    metadata: dict[str, JsonValue] | None = None

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        if value is not None and len(json.dumps(value).encode()) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is limited to {MAX_METADATA_BYTES} bytes")
        return value


class KeyCreate(KeySettings):
    """`POST /admin/keys`."""


class KeyUpdate(KeySettings):
    """`PATCH /admin/keys/{id}`: the fields given replace the key's; `null` clears one."""
