"""The URL paths that middleware treats specially, named once."""

from __future__ import annotations

INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""Requests that reach the engine (or the response cache)."""
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})
"""Health probes and scrapes: not traced, logged at debug level."""
PLAYGROUND_PATH = "/playground"
"""The playground page and its files (`sluicegate/playground/`), served without a key."""
