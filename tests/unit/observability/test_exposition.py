"""`/metrics` rendering: off the event loop, one render shared by the scrapes during it.

The registry here is a private one holding a stand-in collector that counts its calls and
takes 50 ms, like a large registry does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from sluicegate.observability.exposition import Exposition


class SlowCollector(Collector):
    def __init__(self) -> None:
        self.calls = 0
        self.threads: set[int] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        self.threads.add(threading.get_ident())
        time.sleep(0.05)
        yield GaugeMetricFamily("sluicegate_test_renders", "Renders so far.", value=self.calls)


def exposition() -> tuple[Exposition, SlowCollector]:
    registry = CollectorRegistry(auto_describe=False)
    collector = SlowCollector()
    registry.register(collector)
    return Exposition(registry), collector


async def test_scrapes_during_a_render_share_it() -> None:
    view, collector = exposition()
    bodies = await asyncio.gather(*(view.render() for _ in range(5)))
    assert collector.calls == 1
    assert len(set(bodies)) == 1 and b"sluicegate_test_renders 1.0" in bodies[0]
    # The next scrape, after the render ended, sees the series as they are now.
    assert b"sluicegate_test_renders 2.0" in await view.render()


async def test_the_render_runs_off_the_event_loop() -> None:
    view, collector = exposition()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await view.render()
    ticker.cancel()
    assert threading.get_ident() not in collector.threads
    assert ticks >= 3, "the loop stood still while the registry rendered"


async def test_a_scraper_that_leaves_does_not_cancel_the_others_render() -> None:
    view, collector = exposition()
    leaving = asyncio.create_task(view.render())
    staying = asyncio.create_task(view.render())
    await asyncio.sleep(0.01)
    leaving.cancel()
    assert b"sluicegate_test_renders 1.0" in await staying
    assert collector.calls == 1


async def test_a_restricted_view_renders_only_the_series_it_names() -> None:
    from prometheus_client import Gauge

    registry = CollectorRegistry(auto_describe=True)
    Gauge("vllm:num_requests_waiting", "Waiting.", registry=registry).set(3)
    Gauge("sluicegate_other", "Other.", registry=registry).set(1)
    body = await Exposition(registry, names=["vllm:num_requests_waiting"]).render()
    assert b"vllm:num_requests_waiting 3.0" in body
    assert b"sluicegate_other" not in body
