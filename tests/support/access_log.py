"""A gateway's own account of its requests: the JSON access lines it writes
(`SLUICEGATE_LOG_FORMAT=json`), read by tests that time what the gateway did rather than what
a client on a busy machine saw."""

from __future__ import annotations

import json
import time

from tests.support.gateway import GatewayProcess


def refusal_times(gateway: GatewayProcess, log_start: int, count: int) -> list[float]:
    """The 503s' times in the gateway (ms, sorted), less the time it waited for each one's
    body (a busy client may send its headers seconds before its body), from its JSON
    access lines since `log_start`, once `count` of them are written (a line may follow its
    answer), or 10 s."""
    deadline = time.monotonic() + 10
    while True:
        lines = [
            json.loads(line)
            for line in gateway.log()[log_start:].splitlines()
            if line.startswith("{")
        ]
        times = sorted(
            float(line["total_ms"]) - float(line["body_wait_ms"])
            for line in lines
            if line.get("status") == 503
        )
        if len(times) >= count or time.monotonic() > deadline:
            return times
        time.sleep(0.05)


def request_millis(gateway: GatewayProcess, request_id: str | None) -> float | None:
    """The gateway's own time for one request (its JSON access line's `total_ms`), or None
    when that line is not (yet) written."""
    for line in gateway.log().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("request_id") == request_id:
                return float(entry["total_ms"])
    return None
