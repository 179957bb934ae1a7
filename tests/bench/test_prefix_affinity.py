"""The prefix-affinity benchmark's workload, phase order and reading of vLLM's counters."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from prefix_affinity import affinity_picks, order, prefix_counters, workload

EXPOSITION = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 800.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 5.0
"""


def test_the_counters_are_summed_over_label_sets_and_nothing_else() -> None:
    assert prefix_counters(EXPOSITION) == {
        "vllm:prefix_cache_queries": 1200.0,
        "vllm:prefix_cache_hits": 900.0,
    }


def test_every_system_prompt_meets_every_question_in_a_random_order() -> None:
    args = argparse.Namespace(prefixes=3, prefix_words=50, questions=4)
    conversations = workload(0, args)
    systems = [c[0]["content"] for c in conversations]
    assert len(conversations) == 12
    assert len(set(systems)) == 3
    assert all(systems.count(s) == 4 for s in set(systems))
    assert systems != sorted(systems, key=systems.index)  # shuffled, not grouped
    assert workload(0, args) == conversations


def test_no_phase_reuses_the_system_prompts_of_another() -> None:
    args = argparse.Namespace(prefixes=3, prefix_words=50, questions=1)
    first = {c[0]["content"] for c in workload(0, args)}
    second = {c[0]["content"] for c in workload(1, args)}
    assert not first & second


def test_phases_alternate_which_setting_goes_first() -> None:
    assert order(1) == [False, True]
    assert order(2) == [False, True, True, False]


def test_affinity_picks_are_summed_by_result_over_upstreams() -> None:
    exposition = """\
# HELP sluicegate_upstream_affinity_picks_total Picks.
# TYPE sluicegate_upstream_affinity_picks_total counter
sluicegate_upstream_affinity_picks_total{result="home",upstream="http://a/v1"} 60.0
sluicegate_upstream_affinity_picks_total{result="home",upstream="http://b/v1"} 50.0
sluicegate_upstream_affinity_picks_total{result="spilled",upstream="http://b/v1"} 18.0
sluicegate_upstream_affinity_picks_created{result="home",upstream="http://a/v1"} 1.7e9
"""
    assert affinity_picks(exposition) == {"home": 110.0, "spilled": 18.0}
