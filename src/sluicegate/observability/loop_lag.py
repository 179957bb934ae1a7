"""How late the event loop runs: `sluicegate_event_loop_lag_seconds`.

A task asks to sleep `interval` seconds, again and again; how much later than asked it wakes
is time the loop spent on something that did not yield. On a healthy gateway the lag stays
around a millisecond; every request, stream and probe waits as long as it lasts.
"""

from __future__ import annotations

import asyncio

from sluicegate.observability.metrics import EVENT_LOOP_LAG

INTERVAL_SECONDS = 0.1


async def watch_loop_lag(interval: float = INTERVAL_SECONDS) -> None:
    """Observe the loop's lag every `interval` seconds, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + interval
        await asyncio.sleep(interval)
        EVENT_LOOP_LAG.observe(max(0.0, loop.time() - asked))
