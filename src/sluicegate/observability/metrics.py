"""Every metric sluicegate exports, declared once; code elsewhere only calls inc/observe/set.

Names start with `sluicegate_` and never contain "vllm": vLLM unregisters collectors whose
names do when its engine starts. Labels stay low-cardinality (no request ids, no user text;
API keys appear only as their public id).
"""

from __future__ import annotations

from prometheus_client import Counter

from sluicegate.errors import EngineUnavailableError, GatewayError

ENGINE_UNAVAILABLE = Counter(
    "sluicegate_engine_unavailable_total",
    "Requests answered 503 because the inference engine was not running.",
)
RATE_LIMITED = Counter(
    "sluicegate_rate_limited_total",
    "Requests refused with a 429 by the per-key rate limits.",
    ["limit"],
)
RATE_LIMIT_STORE_ERRORS = Counter(
    "sluicegate_rate_limit_store_errors_total",
    "Rate-limit checks that failed open because the store (Redis) did not answer.",
)
ADMISSION_REFUSED = Counter(
    "sluicegate_admission_refused_total",
    "Requests refused before any work by admission control.",
    ["reason"],
)


def count_error(exc: GatewayError) -> None:
    """Count the errors ops must see, wherever they are rendered (response or stream event)."""
    if type(exc) is EngineUnavailableError:
        ENGINE_UNAVAILABLE.inc()
