"""Every metric sluicegate exports, declared once; code elsewhere only calls inc/observe/set.

Names start with `sluicegate_` and never contain "vllm": vLLM unregisters collectors whose
names do when its engine starts. Labels stay low-cardinality (no request ids, no user text;
API keys appear only as their public id).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sluicegate.errors import EngineUnavailableError, GatewayError
from sluicegate.observability import logs

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
    "Rate-limit operations that Redis did not answer (in time, or at all).",
)
RATE_LIMIT_LOCAL_DECISIONS = Counter(
    "sluicegate_rate_limit_local_decisions_total",
    "Rate-limit checks decided by this replica's own share of the limits, Redis being down.",
)
RATE_LIMIT_LOCAL = Gauge(
    "sluicegate_rate_limit_local",
    "1 while this replica enforces its own share of the rate limits (Redis down), else 0.",
    multiprocess_mode="max",
)
ADMISSION_REFUSED = Counter(
    "sluicegate_admission_refused_total",
    "Requests refused before any work by admission control.",
    ["reason"],
)
PREFILL_QUEUE_TOKENS = Gauge(
    "sluicegate_prefill_queue_tokens",
    "Prompt tokens of the runs handed to the engine and waiting for their first token.",
    multiprocess_mode="livesum",
)
PREFILL_RATE = Gauge(
    "sluicegate_prefill_rate_tokens_per_second",
    "The engine's measured drain rate: prompt tokens reaching their first token per second "
    "while runs wait (0 until measured). TTFT_OBJECTIVE admission divides the queue by it.",
    multiprocess_mode="livesum",
)

# ---- requests and generations (observability.middleware, observability.generation) ------
# LLM latencies run from milliseconds (a cache hit, one decode step) to minutes (long
# completions behind a deep queue): buckets cover 1 ms to 10 min.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
    60.0, 120.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip

REQUESTS = Counter(
    "sluicegate_requests_total",
    "HTTP requests by route template, served model (empty off the inference routes) and "
    "status code; 499 when the client left before the response was complete.",
    ["endpoint", "model", "status"],
)
REQUEST_DURATION = Histogram(
    "sluicegate_request_duration_seconds",
    "End-to-end time of successful inference requests, from arrival to the last byte sent.",
    ["endpoint", "model"],
    buckets=LATENCY_BUCKETS,
)
REQUESTS_IN_FLIGHT = Gauge(
    "sluicegate_requests_in_flight",
    "Inference requests being served, by the model they were routed to (empty until the "
    "route knows it, and for requests refused before).",
    ["model"],
    multiprocess_mode="livesum",
)
EMBEDDING_INPUTS = Counter(
    "sluicegate_embedding_inputs_total",
    "Embedding inputs by model and where their vector came from: `cached` (the embedding "
    "cache) or `computed` (the engine; identical inputs of one request, or of requests in "
    "flight together, count once).",
    ["model", "outcome"],
)
EMBEDDING_STORE_ERRORS = Counter(
    "sluicegate_embedding_cache_store_errors_total",
    "Embedding cache reads and writes the store failed or answered too late (every input is "
    "then computed).",
)
MODEL_FALLBACKS = Counter(
    "sluicegate_model_fallbacks_total",
    "Requests a model could not serve before its first byte, handed to its next fallback, "
    "by reason: unavailable (its engine or every upstream down), overloaded (admission "
    "refused it), rate_limited (an upstream's 429, or the model's own limit), "
    "upstream_error (an upstream failed), context_window (the prompt is over its window).",
    ["model", "fallback", "reason"],
)
CLIENT_DISCONNECTS = Counter(
    "sluicegate_client_disconnects_total",
    "Inference requests whose client left before the response was complete; their engine "
    "work is aborted.",
    ["endpoint", "model"],
)
ERRORS = Counter(
    "sluicegate_errors_total",
    "Errors sent to clients by OpenAI error type and code, including those sent inside a "
    "stream that had started.",
    ["type", "code"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "sluicegate_time_to_first_token_seconds",
    "From a request's arrival to the first token the engine generated for it.",
    ["model"],
    buckets=TTFT_BUCKETS,
)
PHASE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
REQUEST_PHASE = Histogram(
    "sluicegate_request_phase_seconds",
    "The phases of a request's time to first byte (observability.timeline): prepare, wait "
    "(admission, cache), hand_off (to the engine core), queue (the engine's waiting queue), "
    "prefill, deliver (the first token back to the gateway) and write (the first byte out).",
    ["model", "phase"],
    buckets=PHASE_BUCKETS,
)
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
GATEWAY_OVERHEAD = Histogram(
    "sluicegate_gateway_overhead_seconds",
    "The gateway's own time on an inference request before its response began: the time "
    "to the response's start less the engine's (or upstream's) part; the "
    "x-sluicegate-overhead-duration-ms response header.",
    ["model"],
    buckets=OVERHEAD_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "sluicegate_inter_token_latency_seconds",
    "Time between consecutive tokens of one choice, as the engine hands them to streams: "
    "one observation per engine step (a step of several tokens gives their mean gap).",
    ["model"],
    buckets=ITL_BUCKETS,
)
PROMPT_TOKENS = Counter(
    "sluicegate_prompt_tokens_total",
    "Prompt tokens of the generations the engine ran (cache hits are not generations).",
    ["model"],
)
COMPLETION_TOKENS = Counter(
    "sluicegate_completion_tokens_total",
    "Completion tokens the engine generated, aborted generations included.",
    ["model"],
)

EVENT_LOOP_LAG = Histogram(
    "sluicegate_event_loop_lag_seconds",
    "How much later than asked the event loop ran a 100 ms timer: time it spent on work "
    "that did not yield, which every request and probe waited for.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

# ---- response cache ------------------------------------------------------------------------
CACHE_REQUESTS = Counter(
    "sluicegate_cache_requests_total",
    "Completion requests by cache outcome: hit, miss (looked up, generated) or bypass.",
    ["outcome"],
)
CACHE_STORE_ERRORS = Counter(
    "sluicegate_cache_store_errors_total",
    "Cache store operations that failed: get, set, lock, unlock (timeouts, connection errors) "
    "or decode (a corrupt or foreign value). The request is served by the engine anyway.",
    ["op"],
)
CACHE_STAMPEDE_FOLLOWERS = Counter(
    "sluicegate_cache_stampede_followers_total",
    "Requests that waited for an identical in-flight generation instead of starting their own.",
)
CACHE_LOOKUP_SECONDS = Histogram(
    "sluicegate_cache_lookup_seconds",
    "Time to look an entry up in the cache store.",
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
CACHE_BYTES_WRITTEN = Counter(
    "sluicegate_cache_bytes_written_total", "Bytes of entries written to the cache store."
)
CACHE_TTL_SECONDS = Gauge(
    "sluicegate_cache_ttl_seconds",
    "Effective TTL for new cache entries (before jitter), from the observed generation latency.",
    multiprocess_mode="mostrecent",
)
CACHE_NEAR_REQUESTS = Counter(
    "sluicegate_cache_near_requests_total",
    "Lookups in the near cache (decoded entries kept in this process): hit, miss (read from "
    "the store), or off (not serving: its invalidation connection is down or silent).",
    ["outcome"],
)
CACHE_NEAR_INVALIDATIONS = Counter(
    "sluicegate_cache_near_invalidations_total",
    "Near-cache entries dropped because their key changed in the store.",
)
CACHE_NEAR_FLUSHES = Counter(
    "sluicegate_cache_near_flushes_total",
    "Times the near cache was emptied: its invalidation connection was lost, or Redis flushed.",
)
CACHE_NEAR_BYTES = Gauge(
    "sluicegate_cache_near_bytes",
    "Bytes held by the near cache (an upper estimate).",
    multiprocess_mode="livesum",
)
CACHE_NEAR_CONNECTED = Gauge(
    "sluicegate_cache_near_connected",
    "1 while Redis reports changes to cache keys to this process (the near cache may serve).",
    multiprocess_mode="livemin",
)

# ---- token budget --------------------------------------------------------------------------
BUDGET_TRIMMED_REQUESTS = Counter(
    "sluicegate_budget_trimmed_requests_total",
    "Requests whose context was truncated to fit the model's context window.",
)
BUDGET_DROPPED_TOKENS = Counter(
    "sluicegate_budget_dropped_tokens_total",
    "Prompt tokens removed by context truncation.",
)
BUDGET_CLAMPED_MAX_TOKENS = Counter(
    "sluicegate_budget_clamped_max_tokens_total",
    "Requests whose max_tokens was lowered to what the context window leaves.",
)

# ---- tool calling (wire.formats) -----------------------------------------------------------
TOOL_CALL_CHOICES = Counter(
    "sluicegate_tool_call_choices_total",
    "Chat choices rendered for requests offering tools (cache hits included), by tool_choice "
    "mode and outcome: `called` (tool calls, arguments valid JSON), `invalid_arguments` (a "
    "call's arguments are not valid JSON, e.g. cut by max_tokens), `text` (no call found).",
    ["mode", "outcome"],
)
TOOL_CALLS = Counter(
    "sluicegate_tool_calls_total",
    "Tool calls returned to clients, by tool_choice mode.",
    ["mode"],
)


def count_tool_calls(mode: str, arguments: list[str]) -> None:
    """One rendered choice of a request offering tools, and the arguments of its calls."""
    if mode == "none" and not arguments:
        return
    outcome = "text"
    if arguments:
        TOOL_CALLS.labels(mode).inc(len(arguments))
        outcome = "called" if all(_is_json(a) for a in arguments) else "invalid_arguments"
    TOOL_CALL_CHOICES.labels(mode, outcome).inc()


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---- structured outputs (inference.structured) -----------------------------------------------
STRUCTURED_OUTPUT_REQUESTS = Counter(
    "sluicegate_structured_output_requests_total",
    "Requests accepted with a structured-output constraint, by kind: json_schema, "
    "json_object, regex, choice, grammar, or tool_call (tool_choice required or named).",
    ["kind"],
)
STRUCTURED_OUTPUT_CHECK_SECONDS = Histogram(
    "sluicegate_structured_output_check_seconds",
    "Time to check a new constraint before admission (JSON Schema, then vLLM's validation, "
    "where xgrammar parses it), in a worker thread; constraints seen recently are not checked "
    "again. The engine compiles the grammar later, in its own process, unobservable here: "
    "that time is part of the time to first token.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


# ---- media (media/) ---------------------------------------------------------------------------
MEDIA_FETCHES = Counter(
    "sluicegate_media_fetches_total",
    "Images fetched by URL for requests, by outcome: ok, refused (the media policy or a "
    "bound: see sluicegate_media_refusals_total), failed (unreachable, an error status).",
    ["outcome"],
)
MEDIA_FETCH_BYTES = Counter(
    "sluicegate_media_fetch_bytes_total",
    "Bytes of the images fetched by URL.",
)
MEDIA_FETCH_SECONDS = Histogram(
    "sluicegate_media_fetch_seconds",
    "Time to fetch an image by URL (redirects included; refused fetches too).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
MEDIA_REFUSALS = Counter(
    "sluicegate_media_refusals_total",
    "Images refused, by reason: an address the policy refuses (metadata, loopback, "
    "link_local, private, unspecified, reserved), too_large, too_many_pixels, "
    "too_many_images, timeout, redirects, status, unreachable, unresolved, bad_response, "
    "not_an_image, "
    "undecodable, bad_url, bad_data_uri; text_only (a model that reads none), model_refused "
    "(the model's processor cannot read it) and urls_off (MEDIA_FETCH_URLS false).",
    ["reason"],
)


# ---- upstream mode (engine.upstream) ----------------------------------------------------------
# `upstream` is the configured base URL without credentials: a bounded label set.
UPSTREAM_REQUESTS = Counter(
    "sluicegate_upstream_requests_total",
    "Requests sent to each upstream, by outcome: ok, client_error (a 4xx other than 429 "
    "that is passed on), rate_limited (429), server_error (5xx), connect_error, reset (the "
    "connection dropped), timeout, stream_error (failed after output began), cancelled "
    "(the client left).",
    ["upstream", "outcome"],
)
UPSTREAM_PASSED_THROUGH = Counter(
    "sluicegate_upstream_passed_through_total",
    "Streams whose chunks were handed on as the upstream sent them (UPSTREAM_PASS_THROUGH: "
    "one choice, no tools or logprobs, nothing for the response cache to collect), not "
    "parsed and rendered.",
)
UPSTREAM_FIRST_BYTE_SECONDS = Histogram(
    "sluicegate_upstream_first_byte_seconds",
    "Time from sending a request to an upstream to its first output event.",
    ["upstream"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
UPSTREAM_RETRIES = Counter(
    "sluicegate_upstream_retries_total",
    "Requests tried again after failing on this upstream before any output, by reason.",
    ["upstream", "reason"],
)
UPSTREAM_RETRIES_DENIED = Counter(
    "sluicegate_upstream_retries_denied_total",
    "Retries not made because the retry budget was spent.",
)
UPSTREAM_BREAKER_STATE = Gauge(
    "sluicegate_upstream_breaker_state",
    "Each upstream's circuit breaker: 0 closed, 1 open, 2 half-open (the worst of the "
    "workers'; open turns half-open on the next request or health probe).",
    ["upstream"],
    multiprocess_mode="livemax",
)
UPSTREAM_HEALTHY = Gauge(
    "sluicegate_upstream_healthy",
    "1 while the upstream is in: out after `upstream_health_failures` failed probes in a "
    "row, back at one success.",
    ["upstream"],
    multiprocess_mode="livemin",
)
UPSTREAM_IN_FLIGHT = Gauge(
    "sluicegate_upstream_in_flight",
    "Requests in flight to each upstream.",
    ["upstream"],
    multiprocess_mode="livesum",
)
UPSTREAM_AFFINITY_PICKS = Counter(
    "sluicegate_upstream_affinity_picks_total",
    "With prefix affinity, upstreams picked for a request, by how: `home` (the prefix's own "
    "upstream on the ring) or `spilled` (a later one on the ring: the home was over its load "
    "bound, unavailable, or already tried).",
    ["upstream", "result"],
)
UPSTREAM_OUTCOMES = (
    "ok",
    "client_error",
    "rate_limited",
    "server_error",
    "auth_error",
    "connect_error",
    "reset",
    "timeout",
    "stream_error",
    "cancelled",
)
UPSTREAM_RETRY_REASONS = ("rate_limited", "server_error", "connect_error", "reset", "timeout")
"""The outcomes a request is tried again after (the `reason` of `UPSTREAM_RETRIES`)."""


# ---- logs ----------------------------------------------------------------------------------
class _LogRecordsDropped(Collector):
    """Read at scrape time from `observability.logs`, which must not import prometheus_client:
    `settings` imports it, and loading the settings loads no metrics library."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "sluicegate_log_records_dropped",
            "Log records dropped because the log buffer was full (the writer fell behind a slow "
            "or blocked stderr).",
            value=logs.dropped_records(),
        )


REGISTRY.register(_LogRecordsDropped())

# ---- the traffic capture (observability.capture) ----------------------------------------------
OBJECTIVE_REQUESTS = Counter(
    "sluicegate_objective_requests_total",
    "Inference requests judged against the service objective (SLO_TTFT, SLO_ITL), by the "
    "model they were routed to and outcome: `met`, `missed` (too slow, a server error, a "
    "client gone after the TTFT bound), `refused` (429, 503). Attainment: met over all.",
    ["model", "outcome"],
)
TRAFFIC_CAPTURE_LINES = Counter(
    "sluicegate_traffic_capture_lines_total",
    "Engine sequences seen by the traffic capture (TRAFFIC_CAPTURE), one profile line each, by "
    "outcome: `written`; `sampled_out` (TRAFFIC_CAPTURE_SAMPLE left the request out); "
    "`dropped` (the writer fell behind, an earlier request held it back too long, no tokenizer "
    "counted its prompt, or the file could not be written); `over_size` "
    "(TRAFFIC_CAPTURE_MAX_BYTES reached).",
    ["outcome"],
)


def count_error(exc: GatewayError) -> None:
    """Count the errors ops must see, wherever they are rendered (response or stream event)."""
    count_error_kind(exc.error_type, exc.code)
    if type(exc) is EngineUnavailableError:
        ENGINE_UNAVAILABLE.inc()


def count_error_kind(error_type: str, code: str | None) -> None:
    """Count an error body built without a `GatewayError` (validation, routing, crashes)."""
    ERRORS.labels(error_type, code or "none").inc()


# Series with a known, fixed set of label values start at zero, so rates, ratios and alerts
# have data before the first event instead of being absent.
for _outcome in ("hit", "miss", "bypass"):
    CACHE_REQUESTS.labels(_outcome)
for _op in ("get", "set", "lock", "unlock", "decode"):
    CACHE_STORE_ERRORS.labels(_op)
for _outcome in ("hit", "miss", "off"):
    CACHE_NEAR_REQUESTS.labels(_outcome)
for _reason in (
    "connections",
    "overloaded",
    "shutting_down",
    "concurrency_limit_exceeded",
    "ttft_objective",
    "engine_waiting",
    "engine_running",
    "kv_cache",
    "parse_queue",
):
    ADMISSION_REFUSED.labels(_reason)
for _kind in ("json_schema", "json_object", "regex", "choice", "grammar", "tool_call"):
    STRUCTURED_OUTPUT_REQUESTS.labels(_kind)
for _outcome in ("ok", "refused", "failed"):
    MEDIA_FETCHES.labels(_outcome)
for _reason in (
    "metadata",
    "loopback",
    "link_local",
    "private",
    "unspecified",
    "reserved",
    "too_large",
    "too_many_pixels",
    "too_many_images",
    "timeout",
    "redirects",
    "status",
    "unreachable",
    "unresolved",
    "bad_response",
    "not_an_image",
    "undecodable",
    "bad_url",
    "bad_data_uri",
    "text_only",
    "model_refused",
    "urls_off",
):
    MEDIA_REFUSALS.labels(_reason)
for _mode in ("auto", "required", "named"):
    TOOL_CALLS.labels(_mode)
    for _tool_outcome in ("called", "invalid_arguments", "text"):
        TOOL_CALL_CHOICES.labels(_mode, _tool_outcome)
TRAFFIC_CAPTURE_OUTCOMES = ("written", "sampled_out", "dropped", "over_size")
for _outcome in TRAFFIC_CAPTURE_OUTCOMES:
    TRAFFIC_CAPTURE_LINES.labels(_outcome)

# ---- keys, budgets and the usage ledger (tenancy, quota.budgets) -------------------------
# `key` is a key's public id for the first METRICS_MAX_KEYS keys a process sees, then
# `other` (`observability.key_label`), so a platform of thousands of keys stays a few
# hundred series.
KEY_REQUESTS = Counter(
    "sluicegate_key_requests_total",
    "Inference requests settled, by API key (bounded: the rest as `other`).",
    ["key"],
)
KEY_TOKENS = Counter(
    "sluicegate_key_tokens_total",
    "Tokens used by settled requests, by API key (bounded) and kind (input, output).",
    ["key", "kind"],
)
BUDGET_REFUSALS = Counter(
    "sluicegate_budget_refusals_total",
    "Requests refused with a 429 insufficient_quota because their key's budget was used up.",
    ["key"],
)
BUDGET_USED = Gauge(
    "sluicegate_budget_used_ratio",
    "The part of its budget a key has used in the current period, as last seen (0 to 1).",
    ["key"],
    multiprocess_mode="max",
)
BUDGET_LOCAL_DECISIONS = Counter(
    "sluicegate_budget_local_decisions_total",
    "Budget checks decided by this replica's own share of what was left, Redis being down.",
)
USAGE_BATCHES = Counter(
    "sluicegate_usage_batches_total",
    "Usage ledger batches sent to Redis, by outcome (written, failed: retried).",
    ["outcome"],
)
USAGE_LOST = Counter(
    "sluicegate_usage_lost_total",
    "Usage the ledger dropped after its writes failed for USAGE_GIVE_UP_SECONDS (or at "
    "shutdown), by measure (requests, input_tokens, output_tokens, ..., cost in nano-units).",
    ["measure"],
)
MANAGED_KEYS = Gauge(
    "sluicegate_managed_keys",
    "Managed API keys this process knows (its copy of the key store).",
    multiprocess_mode="max",
)
MANAGED_KEY_RECORDS_SKIPPED = Counter(
    "sluicegate_managed_key_records_skipped_total",
    "Managed key records read from Redis that could not be applied (unreadable, or out of the "
    "admin API's bounds: written around it) and were skipped: the key is refused here.",
)
MANAGED_KEYS_STORE_LOST = Counter(
    "sluicegate_managed_keys_store_lost_total",
    "Reloads that found no managed key in Redis while this process knew some, and no deletion "
    "logged: taken as lost data (a Redis restarted empty, a failover, an eviction), the "
    "process's copy kept.",
)
MANAGED_KEYS_SYNC_ERRORS = Counter(
    "sluicegate_managed_keys_sync_errors_total",
    "Unexpected errors while following the managed keys (not Redis failures): logged, and the "
    "keys reloaded whole.",
)
