"""The TTFT timeline benchmark's readings (bench/ttft_timeline.py): engine histograms and the
gateway's phases, as means over a run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from ttft_timeline import means_ms, table, totals

BEFORE = """\
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.0
# TYPE sluicegate_request_phase_seconds histogram
sluicegate_request_phase_seconds_count{model="m",phase="prepare"} 2.0
sluicegate_request_phase_seconds_sum{model="m",phase="prepare"} 0.004
"""
AFTER = """\
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 2.0
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 2.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.5
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 0.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.0
# TYPE sluicegate_request_phase_seconds histogram
sluicegate_request_phase_seconds_count{model="m",phase="prepare"} 6.0
sluicegate_request_phase_seconds_sum{model="m",phase="prepare"} 0.012
sluicegate_request_phase_seconds_count{model="m",phase="write"} 4.0
sluicegate_request_phase_seconds_sum{model="m",phase="write"} 0.002
"""


def test_the_means_are_of_the_run_alone_added_over_label_sets_and_by_phase() -> None:
    means = means_ms(totals(BEFORE), totals(AFTER))
    # queue: (2.0 + 0.5 - 1.0) s over (4 + 2 - 2) requests
    assert means == {"engine queue": 375.0, "phase prepare": 2.0, "phase write": 0.5}


def test_the_table_compares_the_servers_and_shows_the_gateways_phases() -> None:
    runs = [
        {"kind": "vllm", "repeat": 0, "client mean TTFT": 100.0, "engine queue": 10.0},
        {"kind": "sluicegate", "repeat": 0, "client mean TTFT": 110.0, "phase prepare": 2.0},
    ]
    report = table(runs)
    assert "| 1 | vllm | 100.0 | – |" in report
    assert "| 1 | 2.0 | – |" in report
    assert "- client mean TTFT: 1.10x" in report
