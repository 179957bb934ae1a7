"""The latency probes' reading of their figures (bench/latency_probes.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from latency_probes import quantile, row, table


def test_the_quantile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 100 values, unsorted
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 1.0) == 100.0
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([1.0, 2.0], 0.01) == 1.0


def test_a_row_reports_milliseconds_and_an_empty_one_dashes() -> None:
    figures = row("refusal", "from the client", [0.010, 0.020, 0.030, 0.500], "note")
    assert figures["count"] == 4
    assert figures["median_ms"] == 25.0
    assert figures["p99_ms"] == figures["max_ms"] == 500.0
    text = table([figures, row("refusal", "in the gateway", [])])
    lines = text.splitlines()
    assert lines[0].startswith("| probe | what | n | median ms | P99 ms | max ms |")
    assert lines[2] == "| refusal | from the client | 4 | 25.0 | 500.0 | 500.0 | note |"
    assert lines[3] == "| refusal | in the gateway | 0 | - | - | - |  |"
