"""`/admin/keys` bodies: every number bounded to what a limit or budget can hold."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluicegate.prices import NANO
from sluicegate.wire.admin_keys import MAX_AMOUNT, MAX_COST, KeyCreate


@pytest.mark.parametrize(
    "body",
    [
        {"rpm": MAX_AMOUNT + 1},
        {"tpm": MAX_AMOUNT + 1},
        {"rpm": 1e300},
        {"budget": {"tokens": MAX_AMOUNT + 1, "period": "day"}},
        {"budget": {"cost": 1e300, "period": "month"}},
        {"budget": {"cost": MAX_COST + 0.5, "period": "month"}},
    ],
)
def test_a_number_past_what_redis_counts_exactly_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KeyCreate.model_validate(body)


def test_the_largest_numbers_are_taken() -> None:
    settings = KeyCreate.model_validate(
        {"rpm": MAX_AMOUNT, "tpm": MAX_AMOUNT, "budget": {"cost": MAX_COST, "period": "day"}}
    )
    assert settings.rpm == settings.tpm == 2**53
    assert settings.budget is not None and settings.budget.cost is not None
    assert settings.budget.cost * NANO <= 2**53  # the counter, in nano-units, stays exact


def test_an_expiry_past_the_year_9999_in_utc_is_refused() -> None:
    """Its offset takes it past what a datetime holds: no process could say when it expired."""
    with pytest.raises(ValidationError, match="expires_at"):
        KeyCreate.model_validate({"expires_at": "9999-12-31T23:59:59-01:00"})
    taken = KeyCreate.model_validate({"expires_at": "9999-12-31T23:59:59Z"})
    assert taken.expires_at is not None and taken.expires_at.year == 9999
