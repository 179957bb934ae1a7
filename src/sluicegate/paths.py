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
METRICS_PATH = "/metrics"
METRICS_PATHS = frozenset({METRICS_PATH, "/metrics/engine"})
"""Scrapes: every series, and the engine's scheduling state alone (for routers)."""
READY_PATH = "/ready"
PROBE_PATHS = frozenset({"/health", READY_PATH}) | METRICS_PATHS
"""Health probes and scrapes: not traced, logged at debug level."""
PLAYGROUND_PATH = "/playground"
"""The playground page and its files (`sluicegate/playground/`), served without a key."""
ADMIN_PREFIX = "/admin"
"""The admin API (`/admin/keys`, `/admin/usage`, `/admin/admission`): admin keys only
(`http.admin_guard`)."""
LORA_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
"""Loading and unloading LoRA adapters at run time: admin keys only too."""


def is_admin_path(path: str) -> bool:
    """Whether `path` is one of the admin endpoints (or under their prefix), trailing slashes
    or not (the router redirects one without them there, after the body is read)."""
    path = route_path(path)
    return path in LORA_PATHS or path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


def route_path(path: str) -> str:
    """`path` without trailing slashes: the route it leads to (`/v1/load_lora_adapter/` is
    `/v1/load_lora_adapter`, through a redirect)."""
    return path.rstrip("/") or "/"
