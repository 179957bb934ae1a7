"""The hot-path profile's summary (bench/profile_hot_path.py): own and inclusive shares."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from profile_hot_path import summary

RUN = 'process 1:"python";run (asyncio/runners.py:118)'
HANDLE = "handle (src/sluicegate/http/sse.py:10)"
COLLAPSED = f"""\
{RUN};{HANDLE};dumps (site-packages/orjson.py:3) 6
{RUN};{HANDLE} 2
{RUN};select (lib/python3.11/selectors.py:468) 2
"""


def test_shares_are_of_every_sample_own_and_inclusive(tmp_path: Path) -> None:
    collapsed = tmp_path / "stacks.txt"
    collapsed.write_text(COLLAPSED)
    report = summary(collapsed, top=10)
    assert report.startswith("10 samples")
    own, inclusive = report.split("| function (inclusive)")
    assert "| `dumps (orjson.py)` | 60.0% |" in own
    assert "| `handle (sluicegate/http/sse.py)` | 20.0% |" in own
    assert "| `handle (sluicegate/http/sse.py)` | 80.0% |" in inclusive
    assert "| `run (asyncio/runners.py)` | 100.0% |" in inclusive
    assert "| `select (selectors.py)` | 20.0% |" in own
