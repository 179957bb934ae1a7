"""`/admin/admission` bodies (`wire.admission`): a change over the current bounds, and the
same limits as the settings the bounds start from."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluicegate.settings import Settings
from sluicegate.wire.admission import AdmissionBounds

CURRENT = AdmissionBounds(ttft_objective=2.0, max_engine_waiting=4, max_kv_cache_usage=0.9)


def test_a_change_over_the_current_bounds_sets_unsets_and_keeps() -> None:
    change = AdmissionBounds.model_validate({"max_engine_waiting": None, "max_engine_running": 8})
    assert change.over(CURRENT) == AdmissionBounds(
        ttft_objective=2.0, max_engine_running=8, max_kv_cache_usage=0.9
    )
    assert AdmissionBounds().over(CURRENT) == CURRENT
    assert CURRENT.over(AdmissionBounds()) == CURRENT


def test_the_changes_name_each_bound_that_differs() -> None:
    after = AdmissionBounds.model_validate({"ttft_objective": None}).over(CURRENT)
    assert after.changes(CURRENT) == [("ttft_objective", 2.0, None)]
    assert CURRENT.changes(CURRENT) == []


@pytest.mark.parametrize("name", list(AdmissionBounds.model_fields))
def test_each_bound_has_its_settings_limits(name: str) -> None:
    """A value the setting refuses at start is refused at run time, and the other way round."""
    assert Settings.model_fields[name].metadata == AdmissionBounds.model_fields[name].metadata
    assert Settings.model_fields[name].annotation == AdmissionBounds.model_fields[name].annotation


def test_a_bound_is_not_changed_in_place() -> None:
    with pytest.raises(ValidationError):
        CURRENT.ttft_objective = 1.0
