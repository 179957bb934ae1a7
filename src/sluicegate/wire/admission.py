"""`/admin/admission` bodies: the gateway's four admission bounds, as `GET` answers them and
as `PUT` changes them (`inference.admission`).

Each bound is what its setting is (`TTFT_OBJECTIVE`, `MAX_ENGINE_WAITING`,
`MAX_ENGINE_RUNNING`, `MAX_KV_CACHE_USAGE`), with the same limits: a value the setting would
refuse at start is a 400 here. A field sent sets its bound, `null` unsets it, and one left
out keeps it as it is; so `GET`'s answer, sent back, changes nothing. Strict: unknown fields
are refused (a misspelt bound must not pass as a change that did nothing), and a number sent
as a string, a boolean, or an integer bound sent with a fraction, is refused, not coerced.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdmissionBounds(BaseModel):
    """The four bounds; each None when it is unset (or, in a `PUT`, left out)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    ttft_objective: float | None = Field(default=None, gt=0)
    """Seconds to the first token (`prefill_queue`)."""
    max_engine_waiting: int | None = Field(default=None, ge=0)
    max_engine_running: int | None = Field(default=None, ge=1)
    max_kv_cache_usage: float | None = Field(default=None, gt=0, le=1)
    """0 to 1."""

    def over(self, current: AdmissionBounds) -> AdmissionBounds:
        """`current` with the bounds this change sets or unsets; those it leaves out kept."""
        return current.model_copy(update=self.model_dump(exclude_unset=True))

    def changes(self, before: AdmissionBounds) -> list[tuple[str, object, object]]:
        """Each bound that differs from `before`'s: its name, its value there, and here."""
        return [
            (name, getattr(before, name), getattr(self, name))
            for name in type(self).model_fields
            if getattr(before, name) != getattr(self, name)
        ]
