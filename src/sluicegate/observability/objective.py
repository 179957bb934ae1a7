"""The service objective (`SLO_TTFT`, `SLO_ITL`): each inference request judged against it as
it ends, for the dashboard's attainment (`sluicegate_objective_requests_total`).

A request meets the objective when its first token (a stream's first text, or the first byte
of an answer sent whole) came within `SLO_TTFT` of its arrival and, with `SLO_ITL`, its own
90th percentile gap between tokens is within that: the judgement `sluicegate tune` scores
trials by (`tuning.objective`). The gaps are counted as they come, in O(1) a step
(`RequestRecord.gaps`, `slow_gaps`): the 90th percentile (nearest rank) is within the bound
exactly when at least ceil(0.9 n) of the n gaps are.

Outcomes: `met`; `refused` (429 or 503: a rate limit, a budget, admission), which the
attainment counts against the objective, as the tune does; `missed` (too slow, a server
error, or a client that gave up after the TTFT bound without its first token). Not counted:
other client errors (a bad request is no measure of the service) and a client that left
before the bound passed without its first token (nothing to judge).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sluicegate.observability.record import RequestRecord

CLIENT_CLOSED = 499
REFUSED = (429, 503)


@dataclass(frozen=True, slots=True)
class ServiceObjective:
    ttft: float
    itl: float | None = None

    def judge(self, record: RequestRecord, status: int, now: float | None = None) -> str | None:
        """`met`, `missed` or `refused`; None when the request says nothing of it."""
        if status in REFUSED:
            return "refused"
        first = record.first_token or record.first_byte
        if first is None:
            if status == CLIENT_CLOSED:
                waited = (now or time.perf_counter()) - record.started
                return "missed" if waited > self.ttft else None
            return "missed" if status >= 500 else None
        if 400 <= status < 500 and status != CLIENT_CLOSED:
            return None
        if status >= 500 or first - record.started > self.ttft:
            return "missed"
        slow_pace = record.gaps - record.slow_gaps < math.ceil(0.9 * record.gaps)
        return "missed" if self.itl is not None and slow_pace else "met"
