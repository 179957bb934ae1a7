"""The bounded `key` label of per-key metrics (`observability.key_label`)."""

from __future__ import annotations

from sluicegate.observability.key_label import OTHER, KeyLabels
from tests.support.metrics import local_value


def test_the_first_keys_get_their_own_label_and_the_rest_are_other() -> None:
    labels = KeyLabels(cap=3)
    assert [labels.label(f"key-label-{i}") for i in range(3)] == [
        "key-label-0",
        "key-label-1",
        "key-label-2",
    ]
    assert labels.label("key-label-3") == OTHER and labels.label("key-label-9") == OTHER
    assert labels.label("key-label-1") == "key-label-1"  # a named key stays named


def test_settled_requests_count_under_the_label() -> None:
    labels = KeyLabels(cap=1)
    before = local_value("sluicegate_key_tokens_total", key=OTHER, kind="output")
    labels.settled("key-label-first", 10, 5)
    labels.settled("key-label-second", 7, 3)
    labels.settled("key-label-third", 1, 2)
    assert local_value("sluicegate_key_tokens_total", key="key-label-first", kind="input") >= 10
    after = local_value("sluicegate_key_tokens_total", key=OTHER, kind="output")
    assert after - before == 5
