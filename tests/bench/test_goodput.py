"""The goodput benchmark's reading of outcomes (bench/goodput.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from goodput import Outcome, summary, table


def test_goodput_counts_whole_answers_within_the_objective_per_second_of_arrivals() -> None:
    outcomes = [
        Outcome(200, ttft=0.5, latency=3.0, complete=True),
        Outcome(200, ttft=1.9, latency=4.0, complete=True),
        Outcome(200, ttft=2.5, latency=5.0, complete=True),  # too late
        Outcome(200, ttft=0.4, latency=2.0, complete=False),  # cut short
        Outcome(503, latency=0.004),
        Outcome(429, latency=0.002),
        Outcome(0, latency=120.0),  # given up
    ]
    result = summary(outcomes, window=2.0, objective=2.0)
    assert result["goodput"] == 1.0
    assert (result["sent"], result["answered"], result["refused"], result["lost"]) == (7, 4, 2, 1)
    assert result["ttft_p50"] is not None and 0.5 <= result["ttft_p50"] <= 1.9
    assert result["refusal_p99_ms"] is not None and 3.9 < result["refusal_p99_ms"] <= 4.0


def test_the_table_has_both_servers_and_their_ratios() -> None:
    ours = summary([Outcome(200, ttft=0.5, latency=1, complete=True)] * 3, 1.0, 2.0)
    theirs = summary([Outcome(200, ttft=4.0, latency=9, complete=True)] * 3, 1.0, 2.0)
    report = table([{"multiple": 4.0, "rate": 5.6, "sluicegate": ours, "vllm": theirs}], 2.0)
    assert "| 4x (5.60/s) | vllm | 3 | 0.00 |" in report
    assert "- 4x: goodput –, P99 TTFT of admitted 0.12x" in report
