"""The Prometheus exposition behind `/metrics`: rendered off the event loop, once for all
the scrapes that arrive while it renders; and `/metrics/engine`, the few series a router reads.

An endpoint picker of the Gateway API inference extension scrapes every model server every
50 ms, and rendering the whole registry (vLLM's ~370 samples and the gateway's ~250) is pure
Python that takes milliseconds (bench/metrics_scrape.py). On the loop, that would stall every
stream for as long, twenty times a second. In a worker thread the loop keeps its turns (it
takes the GIL back every switch interval: 1 ms, as `server` sets it). Scrapes that arrive
during a render share its result, so more scrapers (pickers in HA, Prometheus) add no renders
beyond one at a time. A picker needs only the engine's scheduling state: `ENGINE_STATE`
renders a few samples instead of hundreds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry, RestrictedRegistry

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

ENGINE_STATE = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
)
"""What the inference extension's model server protocol asks of an engine: its queue, its
batch, its KV cache use and layout, and its LoRA adapters (vLLM exports the last only while
LoRA is on: `LORA_MODULES` or `ALLOW_RUNTIME_LORA`)."""


def gateway_registry() -> CollectorRegistry:
    """Where the gateway's series are read from: this process's registry, or with several
    workers (`PROMETHEUS_MULTIPROC_DIR`, set by the supervisor) every worker's files, merged
    by prometheus-client's multiprocess collector (counters and histograms summed, each gauge
    as its `multiprocess_mode` says; vLLM's engine gauges are its `mostrecent`)."""
    if os.environ.get(MULTIPROCESS_DIR) is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


class Exposition:
    def __init__(
        self, registry: CollectorRegistry | None = None, names: Iterable[str] | None = None
    ) -> None:
        self._registry = registry
        self._names = None if names is None else tuple(names)
        self._source: CollectorRegistry | RestrictedRegistry | None = None
        self._rendering: asyncio.Future[bytes] | None = None

    def _collected(self) -> CollectorRegistry | RestrictedRegistry:
        if self._source is None:
            registry = self._registry or gateway_registry()
            names = self._names
            source = registry if names is None else registry.restricted_registry(names)
            self._source = source
            return source
        return self._source

    async def render(self) -> bytes:
        """The text format of the series now, or of the render already under way."""
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(
                asyncio.to_thread(generate_latest, self._collected())
            )
            self._rendering.add_done_callback(self._finished)
        # shield: a scraper that leaves must not cancel the render the others wait for.
        return await asyncio.shield(self._rendering)

    def _finished(self, _: asyncio.Future[bytes]) -> None:
        self._rendering = None


exposition = Exposition()
"""Every series of the gateway's registry (vLLM's engine registers its own there too)."""
engine_state = Exposition(names=ENGINE_STATE)
"""The engine's scheduling state alone, for an inference pool's endpoint picker."""
