"""The stop benchmark's reading of a gateway's log and its table (bench/engine_stop.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The benchmark imports its sibling modules as a script does (`bench/` first on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench.engine_stop import engines_part, report

LOG = """\
(EngineCore pid=1) INFO 12-07 09:06:36 [multiproc_executor.py:479] waiting for worker exit
2026-12-07 09:06:36,875 INFO sluicegate.app: shutting down the engines
(EngineCore pid=1) INFO 12-07 09:06:37 [multiproc_executor.py:486] all workers exited
2026-12-07 09:06:38,130 INFO uvicorn.error: Application shutdown complete.
"""


def test_the_engines_part_runs_from_the_gateways_line_to_uvicorns() -> None:
    assert engines_part(LOG) == pytest.approx(1.255)
    assert engines_part(LOG.replace("shutting down the engines", "other")) is None
    assert engines_part("") is None


def test_the_table_holds_medians_and_the_ratio_to_vllms_server() -> None:
    runs: list[dict[str, object]] = [
        {
            "target": "sluicegate",
            "exit_code": 0,
            "stop_s": s,
            "engines_s": s - 0.3,
            "force_killed": False,
        }
        for s in (1.5, 1.6, 1.9)
    ] + [
        {"target": "vllm", "exit_code": 0, "stop_s": s, "engines_s": None, "force_killed": True}
        for s in (0.4, 0.5)
    ]
    table = report(runs).splitlines()
    assert table[2] == "| sluicegate | 3 | 1.60 | 3.56x | 1.30 | 0 | [0] |"
    assert table[3] == "| vllm | 2 | 0.45 | 1.00x | - | 2 | [0] |"
