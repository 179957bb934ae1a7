"""Pool management and health: one model's upstreams, probed, marked in and out, and `/ready`.

Every `health_interval` seconds each upstream is probed (`health_path`); `health_failures`
failed probes in a row take it out, one good probe puts it back (and ends a 503's
Retry-After wait). A probe of `/v1/models`, or a listing fetched after another probe,
refreshes what the upstream lists (`Upstream.models`: the adapters requests may go to).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence

import httpx
from prometheus_client import Gauge

from sluicegate.engine.upstream.breaker import STATE_VALUES, BreakerState
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.discovery import HEALTH_TIMEOUT, listing_of, refresh_listing
from sluicegate.engine.upstream.server import Upstream
from sluicegate.errors import EngineUnavailableError
from sluicegate.observability import metrics

logger = logging.getLogger(__name__)


class Pool:
    """The upstreams of one model, with their metrics' children and their health probes."""

    def __init__(self, config: UpstreamConfig, upstreams: Sequence[Upstream]) -> None:
        self._config = config
        self.upstreams = list(upstreams)
        self._health: asyncio.Task[None] | None = None
        for upstream in self.upstreams:
            label = upstream.label
            for outcome in metrics.UPSTREAM_OUTCOMES:
                metrics.UPSTREAM_REQUESTS.labels(label, outcome)
            for reason in metrics.UPSTREAM_RETRY_REASONS:
                metrics.UPSTREAM_RETRIES.labels(label, reason)
            metrics.UPSTREAM_HEALTHY.labels(label).set(1)
            metrics.UPSTREAM_IN_FLIGHT.labels(label).set(0)
            breaker_gauge = metrics.UPSTREAM_BREAKER_STATE.labels(label)
            breaker_gauge.set(upstream.breaker.value())
            upstream.breaker.on_change = functools.partial(_show_breaker, breaker_gauge)

    def listed_adapters(self, model: str) -> list[str]:
        """The adapters of `model` its upstreams list (vLLM's servers list each with `parent`
        set to its base model), as of the last probes."""
        names: dict[str, None] = {}
        for upstream in self.upstreams:
            for name, parent in upstream.models.items():
                if parent == model and name != model:
                    names[name] = None
        return list(names)

    def listing(self, adapter: str | None) -> frozenset[int] | None:
        """For an adapter: the upstreams that list it, which the balancer prefers."""
        if adapter is None:
            return None
        return frozenset(i for i, u in enumerate(self.upstreams) if adapter in u.models)

    async def check_health(self) -> None:
        """`/ready`: the pool serves while one of its upstreams is healthy."""
        if not any(u.healthy for u in self.upstreams):
            raise EngineUnavailableError("No upstream is healthy.")

    def watch_health(self) -> None:
        """Probe every upstream every `health_interval` seconds, until `close`."""
        self._health = asyncio.create_task(self._probe_forever(), name="upstream-health")

    async def close(self) -> None:
        """Stop the probes and close every upstream's connections."""
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        for upstream in self.upstreams:
            await upstream.close()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self.probe(u) for u in self.upstreams))
            await asyncio.sleep(self._config.health_interval)

    async def probe(self, upstream: Upstream) -> None:
        """One health probe of `upstream`, which marks it in or out."""
        sent = time.monotonic()
        timeout = min(HEALTH_TIMEOUT, self._config.health_interval)
        lists_models = self._config.health_path.rstrip("/") == "/v1/models"
        try:
            response = await upstream.client.get(
                upstream.origin() + self._config.health_path, timeout=timeout
            )
            answered = response.status_code == 200
            if answered and lists_models:
                upstream.models = listing_of(response)
        except httpx.HTTPError:
            answered = False
        if answered and not lists_models:
            await refresh_listing(upstream, timeout)
        upstream.failed_probes = 0 if answered else upstream.failed_probes + 1
        if answered:
            upstream.probe_answered(sent)
        healthy = answered or (
            upstream.healthy and upstream.failed_probes < self._config.health_failures
        )
        if healthy != upstream.healthy:
            log = logger.info if healthy else logger.warning
            log("upstream %s is %s", upstream.label, "healthy" if healthy else "unhealthy")
        upstream.healthy = healthy
        metrics.UPSTREAM_HEALTHY.labels(upstream.label).set(int(healthy))
        # An open breaker turns half-open as time passes: looked at here, its gauge says so
        # within a probe interval even while no request asks (see `Breaker.on_change`).
        _ = upstream.breaker.state


def _show_breaker(gauge: Gauge, state: BreakerState) -> None:
    gauge.set(STATE_VALUES[state])
