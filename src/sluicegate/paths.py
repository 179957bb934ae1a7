"""The URL paths that middleware treats specially, named once."""

from __future__ import annotations

CACHE_HIT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""Requests a cache hit may answer before routing (`http.cache_hits`). Not the Responses API:
its answers are stored, which the route does."""
INFERENCE_PATHS = CACHE_HIT_PATHS | {"/v1/responses"}
"""Requests that reach the engine (or the response cache)."""
METRICS_PATHS = frozenset({"/metrics", "/metrics/engine"})
"""Scrapes: every series, and the engine's scheduling state alone (for routers)."""
PROBE_PATHS = frozenset({"/health", "/ready"}) | METRICS_PATHS
"""Health probes and scrapes: not traced, logged at debug level."""
PLAYGROUND_PATH = "/playground"
"""The playground page and its files (`sluicegate/playground/`), served without a key."""
