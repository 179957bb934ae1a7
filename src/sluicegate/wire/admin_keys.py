"""`/admin/keys` bodies: a managed key's settings as an admin sends them, and as the API shows
them (`key_view`). Unknown fields are refused (a misspelt `budget` must not pass unnoticed),
and every number is bounded (`MAX_AMOUNT`): a value no limit or budget can hold is a 400
here, not a record that no process can apply."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from sluicegate.prices import NANO

KEY_PRIORITY_BOUND = 1000
"""A key's priority is within ± this, as `KEY_PRIORITIES` ranks are."""
MAX_METADATA_BYTES = 4096
MAX_MODELS = 256
MAX_AMOUNT = 2**53
"""The most a key's `rpm`, `tpm` or token budget may be, and its cost budget in nano-units:
limits and budgets are counted in Redis's Lua numbers (doubles), exact up to 2^53."""
MAX_COST = MAX_AMOUNT // NANO
"""The most a cost budget may be, in units of the prices' currency (9,007,199)."""
FIRST_SECOND, LAST_SECOND = -62135596800, 253402300799
"""0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z, a datetime's range, as Unix seconds: the
expiries a key may have."""

MAX_MODEL_NAME_BYTES = 256
"""The most a model name of a key's `models` may take in UTF-8, as the admin API takes it: 256
names of 256 characters of four bytes each would not fit in `ADMIN_MAX_REQUEST_BYTES`."""


def _utf8_bounded(value: str) -> str:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_MODEL_NAME_BYTES:
        raise ValueError(
            f"a model name takes at most {MAX_MODEL_NAME_BYTES} bytes in UTF-8; this one "
            f"takes {size}"
        )
    return value


ModelName = Annotated[str, Field(min_length=1, max_length=256)]
"""A model name as stored (keys made before names were bounded in bytes keep theirs)."""
SentModelName = Annotated[ModelName, AfterValidator(_utf8_bounded)]
"""A model name as the admin API takes it."""
Amount = Annotated[int, Field(ge=1, le=MAX_AMOUNT)]
Cost = Annotated[float, Field(gt=0, le=MAX_COST)]
Priority = Annotated[int, Field(ge=-KEY_PRIORITY_BOUND, le=KEY_PRIORITY_BOUND)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BudgetSpec(_Strict):
    """`{"tokens": N, "period": "day"}` or `{"cost": X, "period": "month"}`."""

    tokens: Amount | None = None
    cost: Cost | None = None
    period: Literal["day", "month"]

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetSpec:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("a budget gives either `tokens` or `cost`, not both nor neither")
        return self


class KeySettings(_Strict):
    """Every setting of a managed key; each may be left out (the gateway's default)."""

    name: Annotated[str, Field(max_length=256)] | None = None
    models: Annotated[list[SentModelName], Field(max_length=MAX_MODELS)] | None = None
    """The models it may use (others are unknown to it, 404); None: every model."""
    rpm: Amount | None = None
    tpm: Amount | None = None
    priority: Priority | None = None
    budget: BudgetSpec | None = None
    expires_at: datetime | None = None
    """ISO 8601 (UTC unless it says otherwise) or Unix seconds."""
    metadata: dict[str, JsonValue] | None = None

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        if not FIRST_SECOND <= value.timestamp() <= LAST_SECOND:
            raise ValueError("expires_at must lie within the years 1 to 9999, in UTC")
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
