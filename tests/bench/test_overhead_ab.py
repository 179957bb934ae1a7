"""The paired overhead benchmark's readings (bench/overhead_ab.py): engine histogram, processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from overhead_ab import cpu_times, histogram_totals, process_tree, spent_between, table

EXPOSITION = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.75
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.5
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 99.0
"""


def test_a_histogram_is_summed_over_its_label_sets_and_nothing_else() -> None:
    assert histogram_totals(EXPOSITION, "vllm:time_to_first_token_seconds") == (2.25, 6.0)


def test_an_absent_histogram_reads_as_empty() -> None:
    assert histogram_totals(EXPOSITION, "vllm:request_queue_time_seconds") == (0.0, 0.0)


def test_the_process_tree_holds_children_and_their_cpu_time() -> None:
    busy = "sum(range(3_000_000)); print('ready', flush=True); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"  # its work is done, it waits on stdin
        assert child.pid in process_tree(os.getpid())
        (ran, waited), *others = [
            v for k, v in cpu_times(os.getpid()).items() if k.endswith(f":{child.pid}")
        ]
        assert not others
        assert ran > 0.01
        assert waited >= 0
    finally:
        child.kill()
        child.wait()


def test_the_table_shows_the_gap_between_client_and_engine() -> None:
    run = {
        "kind": "sluicegate",
        "repeat": 0,
        "client_ttft_ms": 540.3,
        "engine_ttft_ms": 536.0,
        "median_tpot_ms": 50.5,
        "output_throughput": 17.2,
        "processes": {"python": (1.32, 0.5), "VLLM::Worker": (74.1, 7.7)},
    }
    row = table([run]).splitlines()[2]
    assert row == (
        "| 1 | sluicegate | 540.3 | 536.0 | 4.3 | 50.50 | 17.20 "
        "| python 1.3 (0.50), VLLM::Worker 74.1 (7.70) |"
    )


def test_time_spent_is_per_process_name_without_idle_helpers() -> None:
    before = {"api:10": (1.0, 0.5), "python:11": (0.2, 0.0), "VLLM::Worker:12": (5.0, 1.0)}
    after = {
        "api:10": (2.5, 0.75),
        "python:11": (0.21, 0.0),  # idle: left out, so it cannot hide the API process
        "VLLM::Worker:12": (9.0, 1.5),
        "VLLM::Worker:13": (1.0, 0.0),  # started in between: no reading before
    }
    assert spent_between(before, after) == {"api": (1.5, 0.25), "VLLM::Worker": (4.0, 0.5)}
