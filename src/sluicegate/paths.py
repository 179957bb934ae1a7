"""The URL paths that middleware treats specially, named once."""

from __future__ import annotations

MESSAGES_PATH = "/v1/messages"
ANTHROPIC_PATHS = frozenset({MESSAGES_PATH, "/v1/messages/count_tokens"})
"""Anthropic's Messages API: its errors are in Anthropic's shape, with its statuses."""
CACHE_HIT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", MESSAGES_PATH})
"""Requests a cache hit may answer before routing (`http.cache_hits`). Not the Responses API:
its answers are stored, which the route does."""
INFERENCE_PATHS = CACHE_HIT_PATHS | {"/v1/responses", "/v1/embeddings", "/v1/rerank", "/v1/score"}
"""Requests that reach the engine (or the response cache)."""
METRICS_PATHS = frozenset({"/metrics", "/metrics/engine"})
"""Scrapes: every series, and the engine's scheduling state alone (for routers)."""
PROBE_PATHS = frozenset({"/health", "/ready"}) | METRICS_PATHS
"""Health probes and scrapes: not traced, logged at debug level."""
PLAYGROUND_PATH = "/playground"
"""The playground page and its files (`sluicegate/playground/`), served without a key."""
