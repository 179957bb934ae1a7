"""The cache-hit benchmark's reading of wrk's output."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cache_hits import _percentile

WRK_OUTPUT = """\
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.02ms  500.00us  10.00ms   87.50%
    Req/Sec    30.00k     1.00k   32.00k    50.00%
  Latency Distribution
     50%  586.00us
     75%    1.00ms
     90%    2.00ms
     99%    1.20s
  300000 requests in 10.00s, 100.00MB read
Requests/sec:  30000.00
"""


def test_percentiles_are_read_from_the_distribution_not_the_stdev_column() -> None:
    # "87.50%" and "50.00%" in the Stdev column end in "50%" too.
    assert _percentile(WRK_OUTPUT, 50) == 0.586
    assert _percentile(WRK_OUTPUT, 99) == 1200.0
