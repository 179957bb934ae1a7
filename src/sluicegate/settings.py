"""sluicegate's one typed configuration object.

Every value comes from, in rising priority: the defaults below, a `.env` file, the
environment (`SLUICEGATE_*`), and `sluicegate serve --flag` (passed in as init arguments).
A bad value stops start-up with a message that names the setting (see `describe_error`).
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluicegate.cache.key import CachePolicy
from sluicegate.engine.lora import VLLM_LORA_RANKS, parse_lora_modules, parse_lora_roots
from sluicegate.engine.model import DEFAULT_MODEL_NAME
from sluicegate.keys import ApiKeyring
from sluicegate.models.config import ModelPrice
from sluicegate.observability.logs import LogFormat
from sluicegate.wire.requests import MAX_MESSAGES, MAX_N, MAX_PROMPTS, Overflow, Truncation

# Settings whose values must never be echoed, not even in an error message.
_ORIGIN = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+)(:\d{1,5})?")
SECRET_SETTINGS = frozenset(
    {
        "api_keys",
        "admin_api_keys",
        "metrics_api_keys",
        "redis_url",
        "rate_limit_redis_url",
        "upstream_api_key",
    }
)
ENV_PREFIX = "SLUICEGATE_"


def _default_model_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluicegate" / "models"


KEY_PRIORITY_BOUND = 1000
"""API key priorities are within ± this (`KEY_PRIORITIES`)."""


KeyPriority = Annotated[int, Field(ge=-KEY_PRIORITY_BOUND, le=KEY_PRIORITY_BOUND)]


class RateLimitOverride(BaseModel):
    """One API key's own limits, by its public id (`key-` + 12 hex digits)."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class Settings(BaseSettings):
    """Gateway and engine configuration. The field descriptions are the reference text of
    `docs/configuration.md` (`make docs` writes it)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
        protected_namespaces=(),
    )

    # --- model -----------------------------------------------------------------------
    model: str | None = Field(
        default=None,
        description="Local Hugging Face folder or hub id. Unset: the bundled SmolLM2.",
    )
    served_model_name: str | None = Field(
        default=None,
        description="Name clients pass as `model`. Unset: the model folder's name.",
    )
    model_cache_dir: Path = Field(
        default_factory=_default_model_cache_dir,
        description="Where `sluicegate model prepare` writes the converted bundled model.",
    )
    revision: str | None = Field(default=None, description="Model revision, for hub ids.")
    trust_remote_code: bool = Field(default=False, description="Allow model code from the hub.")
    chat_template: FilePath | None = Field(
        default=None,
        description="A Jinja chat template file that replaces the model's own. Unset: for the "
        "bundled model, the shipped SmolLM2 template that renders tools and tool calls; for "
        "other models, their own.",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM tool parser that reads tool calls in the model's text for "
        "`tool_choice` auto (`hermes`, `llama3_json`, `pythonic`, ...), or `none`. Unset: "
        "`hermes` for the bundled model, none otherwise (auto then answers with text).",
    )

    # --- models and adapters ----------------------------------------------------------
    models_file: FilePath | None = Field(
        default=None,
        description="A YAML model registry: names, aliases, pools of upstreams, fallbacks, "
        "per-model limits (docs/models.md). Set: no in-process engine unless an entry has "
        "`engine: local`.",
    )
    lora_modules: str = Field(
        default="",
        description="LoRA adapters loaded at start-up, as vLLM's `--lora-modules` takes them: "
        "`name=path` pairs separated by commas, or a JSON list of objects with `name`, `path` "
        "and optionally `base_model_name`. Given: LoRA on.",
    )
    allow_runtime_lora: bool = Field(
        default=False,
        description="Answer `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (admin "
        "keys only when API keys are set). True: LoRA on, even with no adapter at start-up.",
    )
    lora_roots: str = Field(
        default="",
        description="The folders adapters may be loaded from at run time, absolute, separated "
        "by commas: a `lora_path` whose real path (symlinks resolved) is outside all of them is "
        "a 400. Needed by ALLOW_RUNTIME_LORA; LORA_MODULES, the operator's own, may be anywhere.",
    )
    max_loras: int = Field(
        default=1, ge=1, description="LoRA adapters one engine batch may hold at once."
    )
    max_lora_rank: int = Field(
        default=16,
        description="The highest LoRA rank the engine accepts: 1, 8, 16, 32, 64, 128, 256, "
        "320 or 512 (vLLM's choices).",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        description="LoRA adapters kept loaded in memory, at least MAX_LORAS. Unset: MAX_LORAS.",
    )

    # --- embeddings ------------------------------------------------------------------
    embedding_model: str | None = Field(
        default=None,
        description="A model a second in-process vLLM engine runs with vLLM's pooling runner "
        "(a generative checkpoint converted to embed), for /v1/embeddings: a folder, a hub id, "
        "or `bundled` (the bundled model). Unset: no embedding engine in process.",
    )
    embedding_served_name: str | None = Field(
        default=None,
        description="The embedding engine's name in the registry. Unset: the model's name "
        "with `-embed` appended.",
    )
    embedding_memory_fraction: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        description="GPU only: the share of GPU memory the embedding engine may take (the "
        "generative engine's GPU_MEMORY_UTILIZATION must leave it).",
    )
    embedding_cpu_kvcache_space_gib: int = Field(
        default=1, ge=1, description="CPU only: GiB the embedding engine reserves for its batch."
    )
    embedding_cache_ttl_seconds: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="How long an input's embedding is kept in the cache (embeddings are "
        "deterministic: always cached, whatever CACHE_POLICY).",
    )
    max_embedding_inputs: int = Field(
        default=2048, ge=1, le=2048, description="Inputs one embeddings request may hold."
    )
    max_embedding_inputs_per_key: int | None = Field(
        default=None,
        ge=1,
        description="Inputs (texts of /v1/embeddings, /v1/rerank and /v1/score) one API key "
        "may have being embedded before a 429 `concurrency_limit_exceeded`: the embedding "
        "engine's share of one key, apart from its share of sequences. A request of more "
        "is a 400. Unset: 4096 when API keys are configured, no bound without them.",
    )
    max_embedding_values: int = Field(
        default=4_194_304,
        ge=1,
        description="Values (inputs × dimensions) one /v1/embeddings answer may hold, which "
        "bounds its size (a 400 past it): 2048 inputs of 2048 dimensions, 1024 of 4096.",
    )

    # --- upstream mode ---------------------------------------------------------------
    upstream_urls: str = Field(
        default="",
        description="Comma-separated base URLs of OpenAI-compatible servers, each ending in "
        "`/v1` (vLLM, llama.cpp, Ollama, another sluicegate). Set: no engine starts in this "
        "process, requests go to these servers through the same pipeline.",
    )
    upstream_api_key: SecretStr | None = Field(
        default=None, description="Bearer key sent to the upstreams."
    )
    upstream_weights: str = Field(
        default="",
        description="Comma-separated relative weights, one per upstream URL. Unset: equal.",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Upstream mode: a tokenizer folder or hub id for the token budget (needs "
        "the `tokenizer` extra). Unset: the upstream's `/tokenize` where it has one, else no "
        "budget.",
    )
    upstream_max_connections: int = Field(
        default=1024, ge=1, description="Connections per upstream (each stream holds one)."
    )
    upstream_max_keepalive_connections: int = Field(
        default=256, ge=0, description="Idle connections kept open per upstream."
    )
    upstream_keepalive_expiry: float = Field(
        default=30.0, gt=0, description="Seconds an idle upstream connection is kept."
    )
    upstream_http2: bool = Field(
        default=False,
        description="Speak HTTP/2 to the upstreams (over httpx's own transport, whatever "
        "`UPSTREAM_TRANSPORT` says).",
    )
    upstream_transport: Literal["aiohttp", "httpcore"] = Field(
        default="aiohttp",
        description="The HTTP/1.1 client under httpx's API: `aiohttp` (its C parser; see "
        "docs/upstream.md for the settings it does not honour) or `httpcore` (httpx's own).",
    )
    upstream_pass_through: bool = Field(
        default=True,
        description="Hand a plain stream's chunks (one choice, no tools, no logprobs, nothing "
        "for the response cache to collect) on as the upstream sent them, with the "
        "gateway's id, time and model name put in, instead of parsing and rendering each "
        "(docs/upstream.md).",
    )
    upstream_connect_timeout: float = Field(
        default=5.0, gt=0, description="Seconds to open a connection to an upstream."
    )
    upstream_read_timeout: float = Field(
        default=300.0, gt=0, description="Seconds an upstream may go without sending a byte."
    )
    upstream_write_timeout: float = Field(
        default=30.0, gt=0, description="Seconds to send a request body upstream."
    )
    upstream_pool_timeout: float = Field(
        default=5.0, gt=0, description="Seconds to wait for a free pooled connection."
    )
    upstream_max_retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a request before its first byte."
    )
    upstream_retry_backoff: float = Field(
        default=0.05, gt=0, description="Base of the exponential backoff (full jitter), s."
    )
    upstream_retry_backoff_max: float = Field(
        default=2.0, gt=0, description="Longest wait between two tries, s."
    )
    upstream_retry_after_max: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest `Retry-After` of an upstream that is believed, s: a longer one "
        "(or `inf`, or a date far ahead) keeps that upstream out for this long at most, and "
        "clients are passed this value. The trade-off: a pool whose only upstream answered a "
        "429 refuses every request (503, with the time left as `Retry-After`) for up to this "
        "long; lower it to try the upstream sooner, at the risk of more 429s "
        "(docs/upstream.md).",
    )
    upstream_retry_budget: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Retries allowed as a share of requests (0.2: at most 20% more load).",
    )
    upstream_retry_burst: int = Field(
        default=5,
        ge=1,
        description="Retries the budget holds in reserve, on top of its share: over any N "
        "requests, at most this plus `upstream_retry_budget` x N retries. The default covers "
        "the failures an upstream that went down has before its breaker opens.",
    )
    upstream_breaker_failures: int = Field(
        default=5, ge=1, description="Consecutive failures that open an upstream's breaker."
    )
    upstream_breaker_error_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of failed requests (over the last `upstream_breaker_window`) "
        "that opens the breaker.",
    )
    upstream_breaker_window: int = Field(
        default=20, ge=2, description="Requests the error ratio is taken over."
    )
    upstream_breaker_open_seconds: float = Field(
        default=5.0, gt=0, description="Seconds an open breaker waits before a trial request."
    )
    upstream_health_path: str = Field(
        default="/v1/models",
        description="Path probed on each upstream's host (`/health` for vLLM's server).",
    )
    upstream_health_interval: float = Field(
        default=5.0, gt=0, description="Seconds between health probes of each upstream."
    )
    upstream_health_failures: int = Field(
        default=3,
        ge=1,
        description="Health probes in a row that must fail before an upstream is taken out "
        "(one success puts it back): a busy server answering one probe late stays in.",
    )
    upstream_start_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds start-up waits for a pool's upstreams to list their models "
        "(GET /v1/models); none answering by then stops start-up.",
    )
    upstream_prefix_affinity: bool = Field(
        default=False,
        description="Send prompts that start alike to the same upstream (its prefix cache), "
        "by consistent hashing with bounded load.",
    )
    upstream_affinity_chars: int = Field(
        default=256, ge=16, description="Characters of the prompt's start that pick the upstream."
    )
    upstream_affinity_load: float = Field(
        default=2.0,
        ge=1,
        description="Bounded load: an upstream takes affine requests while its in-flight count "
        "is within this factor of the mean.",
    )

    # --- server ----------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port to bind.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Front-end processes sharing the port, each with its own event loop; with "
        "the in-process engine, each is a client of one engine core (vLLM's "
        "--api-server-count). Above 1 the bounds on requests in flight and per-key shares hold "
        "for all of them, and REDIS_URL is required (see docs/operations.md).",
    )
    worker_stall_timeout: float = Field(
        default=30.0,
        gt=0,
        description="With WORKERS above 1: seconds a serving worker's event loop may go "
        "without a turn (stuck in a call that never yields, or stopped) before the supervisor "
        "kills it; the other workers then drain and the gateway exits, as when a worker dies "
        "(docs/operations.md).",
    )
    shutdown_timeout: float = Field(
        default=30.0,
        ge=0,
        description="Seconds in-flight requests may take to finish after SIGTERM.",
    )
    exit_on_engine_death: bool = Field(
        default=True,
        description="When the engine core dies, drain (new requests get 503) and exit with "
        "code 3, so Docker, compose or Kubernetes restart the gateway. `false`: stay up and "
        "answer 503 `engine_unavailable` until restarted by hand.",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Connections served at once, counted as they are accepted: a request on a "
        "connection past them gets a 503 `overloaded` (with Retry-After) and the connection "
        "closes; those accepted first are served. Keep it below the open-file limit "
        "(`ulimit -n`).",
    )
    backlog: int = Field(
        default=2048,
        ge=1,
        description="Connections the kernel queues before the server accepts them.",
    )
    keep_alive_timeout: int = Field(
        default=5,
        ge=1,
        description="Seconds an idle kept-alive connection stays open.",
    )
    request_head_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a request's line and headers may take to arrive, from the "
        "connection (or the first byte of a later request on it); then the connection is "
        "closed, with a 408 if the head had begun.",
    )
    allow_unknown_settings: bool = Field(
        default=False,
        description="Start even when the environment or the `.env` file holds a "
        "`SLUICEGATE_*` name that is no setting (a typo, or a setting of another version), "
        "with a warning for each. Off: such a name stops start-up, naming the closest setting.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level."
    )
    log_format: LogFormat = Field(
        default="plain",
        description="`plain` lines, or one JSON object per line (ours and uvicorn's logs, "
        "including the access log).",
    )

    # --- access ----------------------------------------------------------------------
    api_keys: SecretStr | None = Field(
        default=None,
        description="Comma-separated keys, or @file with one per line; `sha256:<hex>` entries "
        "give a key by its digest. Unset: no authentication.",
    )
    admin_api_keys: SecretStr | None = Field(
        default=None,
        description="Keys of operators, given as API_KEYS are: they may also call the admin "
        "endpoints (loading adapters); each is a valid API key too. Unset: with API keys, no "
        "key may call them.",
    )
    metrics_require_auth: bool = Field(
        default=False, description="Require an API key for /metrics too."
    )
    metrics_api_keys: SecretStr | None = Field(
        default=None,
        description="Keys for scrapers (Prometheus), given as API_KEYS are: they may read "
        "/metrics and /ready's list of models, and call nothing else. With MANAGED_KEYS, "
        "/metrics needs one of them or an admin key.",
    )
    admin_requests_per_minute: int = Field(
        default=120,
        ge=1,
        description="Calls of the admin endpoints (/admin/*, loading LoRA adapters) per minute "
        "per admin key, counted apart from its requests per minute (429 past it).",
    )
    admin_max_request_bytes: int = Field(
        default=96 * 1024,
        ge=1024,
        description="Largest body the admin endpoints accept (413), checked before it is read.",
    )
    managed_keys: bool = Field(
        default=False,
        description="Keys created, changed and revoked at run time through /admin/keys, kept "
        "in Redis as digests and known to every replica within a second (docs/keys.md). Needs "
        "REDIS_URL and ADMIN_API_KEYS; every request then needs a key (managed, or from "
        "API_KEYS, which keep working beside them).",
    )
    key_sync_interval: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Seconds between two reads of the managed keys' changes from Redis.",
    )
    usage_ledger: bool = Field(
        default=True,
        description="Keep the usage ledger (per key, model and day) in Redis, for "
        "/admin/usage and /v1/me/usage. Only with REDIS_URL.",
    )
    usage_flush_interval: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="Seconds between two batched writes of the usage ledger.",
    )
    usage_retention_days: int = Field(
        default=400, ge=1, description="Days the ledger keeps each day's usage."
    )
    usage_give_up_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a failed ledger write is retried before its usage is dropped "
        "(logged, and counted in sluicegate_usage_lost_total).",
    )
    model_prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description='JSON: {"<model>": {"input": X, "output": Y}}, prices per million tokens '
        "(over the models file's `price`): the ledger's cost and budgets in cost.",
    )
    metrics_max_keys: int = Field(
        default=100,
        ge=0,
        le=10000,
        description="Keys with series of their own in the per-key metrics, per process (the "
        "first seen); the others are counted as `other`.",
    )

    # --- browsers ---------------------------------------------------------------------
    cors_allow_origins: str = Field(
        default="",
        description="Comma-separated origins (`https://app.example.com`) whose pages may call "
        "the API from a browser; `*` allows any. Empty: CORS off, browsers block other "
        "origins' pages.",
    )
    playground: bool | None = Field(
        default=None,
        description="Serve the streaming playground page at /playground. Unset: on when "
        "HOST is a loopback address, off otherwise.",
    )

    # --- redis and rate limits -------------------------------------------------------
    redis_url: SecretStr | None = Field(
        default=None,
        description="redis://, rediss:// or unix:// URL (may hold a user and password). "
        "Unset: the cache and rate limits are kept in this process.",
    )
    rate_limit_requests_per_minute: int | None = Field(
        default=None, ge=1, description="Default requests per minute per API key. Unset: none."
    )
    rate_limit_tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Default tokens (prompt + completion) per minute per API key. Unset: none.",
    )
    rate_limit_overrides: dict[str, RateLimitOverride] = Field(
        default_factory=dict,
        description='JSON: {"<key id>": {"requests_per_minute": N, "tokens_per_minute": N}}.',
    )
    rate_limit_redis_timeout: float = Field(
        default=0.25, gt=0, description="Seconds a rate-limit check may wait for Redis."
    )
    rate_limit_local_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="While Redis does not answer, the share of each rate limit this replica "
        "enforces on its own (with N replicas, 1/N keeps the fleet near the limit).",
    )
    rate_limit_redis_url: SecretStr | None = Field(
        default=None,
        description="A Redis of their own for the rate limits, for when the cache's Redis "
        "evicts with an allkeys-* policy. Unset: REDIS_URL.",
    )
    redis_max_connections: int = Field(
        default=64,
        ge=1,
        description="Connections in each Redis pool; an operation waits (within its own "
        "timeout) for a free one.",
    )
    redis_key_prefix: str = Field(
        default="sluicegate",
        min_length=1,
        description="Prefix of every Redis key the gateway writes (cache, locks, rate limits).",
    )

    # --- response cache --------------------------------------------------------------
    cache_policy: CachePolicy = Field(
        default="deterministic",
        description="Which responses are cached: `deterministic` (temperature 0, top_k 1 or "
        "a seed), `all`, or `off`.",
    )
    cache_shared_across_keys: bool = Field(
        default=False,
        description="With API keys set, share cache entries between keys. Off: each key has "
        "its own entries, so no key can learn (from `X-Cache`, `Age`) whether or when another "
        "key sent a prompt. Without API keys there is one namespace either way.",
    )
    cache_ttl_seconds: float = Field(
        default=600.0, gt=0, description="Base TTL of a cache entry, scaled by engine latency."
    )
    cache_ttl_min_seconds: float = Field(default=30.0, gt=0, description="Shortest entry TTL.")
    cache_ttl_max_seconds: float = Field(default=3600.0, gt=0, description="Longest entry TTL.")
    cache_ttl_fast_latency: float = Field(
        default=0.2, ge=0, description="Average generation seconds below which TTL is raised."
    )
    cache_ttl_slow_latency: float = Field(
        default=0.8, ge=0, description="Average generation seconds above which TTL is lowered."
    )
    cache_ttl_fast_factor: float = Field(
        default=3.0, gt=0, description="TTL multiplier while generation is fast."
    )
    cache_ttl_slow_factor: float = Field(
        default=0.5, gt=0, description="TTL multiplier while generation is slow."
    )
    cache_ttl_jitter: float = Field(
        default=0.1, ge=0, lt=1, description="Random spread of each TTL (0.1: ±10%)."
    )
    cache_memory_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Size bound of the in-process cache (used when no Redis URL is set).",
    )
    cache_max_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="Larger responses are not cached: a run stops keeping its output for the "
        "cache (and for late identical requests) once it would make a larger entry.",
    )
    cache_redis_timeout: float = Field(
        default=0.05, gt=0, description="Seconds one cache operation may wait for Redis."
    )
    cache_flight_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds the single-flight lock in Redis outlives its last refresh: how "
        "long other replicas may wait for the entry of a leader that died. A living leader "
        "refreshes it, however long it generates.",
    )
    cache_retry_interval: float = Field(
        default=1.0,
        ge=0,
        description="After a Redis failure, seconds the cache is skipped before trying again.",
    )
    cache_near_max_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=0,
        description="Bytes of decoded entries (and their rendered bodies) each process keeps "
        "in front of the cache store, for hot keys; 0 turns this near cache off. With Redis, "
        "Redis reports every change to a cache key to each process, which drops its copy.",
    )
    cache_near_max_lag: float = Field(
        default=1.0,
        gt=0,
        description="With Redis: seconds the near cache goes on serving after Redis last "
        "proved that it reports every change (a heartbeat answered): the longest a change can "
        "go unseen when the connection to Redis fails silently.",
    )

    # --- responses API store --------------------------------------------------------
    responses_ttl_seconds: int = Field(
        default=30 * 24 * 3600,
        ge=1,
        description="How long a stored response (`store: true`) can be read or continued "
        "(`previous_response_id`); 30 days, as OpenAI keeps them.",
    )
    responses_memory_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Without Redis: bytes of stored responses kept in this process; past it, "
        "the key holding the most loses its oldest first.",
    )
    responses_max_bytes_per_key: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Bytes of stored responses one API key may hold (all clients share one "
        "bound without API keys): past it, the key's own oldest are dropped, never another "
        "key's. At least `RESPONSES_MAX_ENTRY_BYTES`, so that a key can always store its "
        "newest.",
    )
    responses_max_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest stored response (the response and its whole conversation); a "
        "larger one is answered but not stored. Continuing one decodes, converts and stores "
        "it again on the event loop (about 50 ms per MiB), so keep it small.",
    )
    responses_redis_timeout: float = Field(
        default=0.5,
        gt=0,
        description="Seconds one Redis operation of the response store may take (then 503).",
    )

    # --- limits ----------------------------------------------------------------------
    max_in_flight: int = Field(
        default=512, ge=1, description="Inference requests in flight before new ones get a 503."
    )
    ttft_objective: float | None = Field(
        default=None,
        gt=0,
        description="Seconds to the first token that admitted requests keep: a request whose "
        "expected wait for its first token (the engine step in progress, then the prompt "
        "tokens ahead of it over the engine's measured drain rate) is longer gets a 503 "
        "`overloaded` at once, with a Retry-After of how long the queue takes to drain. "
        "Unset: every request is queued.",
    )
    max_engine_waiting: int | None = Field(
        default=None,
        ge=0,
        description="Requests in the engine's waiting queue (vLLM's `num_requests_waiting`) at "
        "which new requests get a 503 `overloaded` at once. In-process engine only. Unset: "
        "no bound.",
    )
    max_engine_running: int | None = Field(
        default=None,
        ge=1,
        description="Requests in the engine's running batch at which new requests get a 503 "
        "`overloaded` at once: below MAX_NUM_SEQS, it keeps each stream's inter-token latency "
        "where that batch size puts it. In-process engine only. Unset: no bound.",
    )
    max_kv_cache_usage: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of the KV cache in use (vLLM's `kv_cache_usage_perc`, 0 to 1) at "
        "which new requests get a 503 `overloaded` at once, before they would make the engine "
        "preempt running ones. In-process engine only. Unset: no bound.",
    )
    max_in_flight_per_key: int | None = Field(
        default=None, ge=1, description="In-flight requests per API key before a 429. Unset: none."
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)."
    )
    max_messages: int = Field(
        default=2048, ge=1, le=MAX_MESSAGES, description="Most messages in one chat request."
    )
    max_prompts: int = Field(
        default=64, ge=1, le=MAX_PROMPTS, description="Most prompts in one completion."
    )
    max_n: int = Field(default=16, ge=1, le=MAX_N, description="Largest `n` accepted.")
    max_sequences_per_request: int = Field(
        default=64,
        ge=1,
        description="Most sequences (prompts × n) one request may start (400 naming `n` or "
        "`prompt`).",
    )
    max_sequences_per_key: int | None = Field(
        default=None,
        ge=1,
        description="Sequences (prompts × n) one API key may have in flight before a 429 "
        "`concurrency_limit_exceeded`. Unset: half of MAX_NUM_SEQS when API keys are "
        "configured, no bound without them.",
    )
    max_tokens_limit: int | None = Field(
        default=None,
        ge=1,
        description="Largest `max_tokens` accepted. Unset: the context bounds it.",
    )
    max_stop_sequences: int = Field(
        default=64,
        ge=1,
        description="Most stop sequences in one request (OpenAI allows 4). vLLM checks each "
        "against every generated token, on the event loop.",
    )
    max_stop_length: int = Field(
        default=1024, ge=1, description="Longest stop sequence accepted, in characters."
    )
    max_tools: int = Field(
        default=128, ge=1, description="Most tools (or functions) in one chat request."
    )
    max_tools_bytes: int = Field(
        default=64 * 1024,
        ge=256,
        description="Longest the tools of one request may be, as JSON, in characters: their "
        "schemas are checked on the event loop and compiled into a grammar for `required`.",
    )
    request_body_timeout: float = Field(
        default=30.0, gt=0, description="Seconds the request body may take to arrive (408)."
    )
    max_large_body_parses: int = Field(
        default=16,
        ge=1,
        description="Request bodies over 128 KiB that may be held at once for the one parse "
        "process (parsing and waiting their turn); more are refused with a 503 `overloaded`.",
    )
    max_large_body_parses_per_key: int = Field(
        default=4,
        ge=1,
        description="Of `max_large_body_parses`, how many one API key may hold; more get a "
        "429 `concurrency_limit_exceeded`, so one key's large bodies do not hold up the "
        "others'.",
    )
    request_timeout: float = Field(
        default=600.0, gt=0, description="Seconds one request, streamed or not, may take (504)."
    )
    stream_stall_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a stream may go without an event, or a write may stay blocked by "
        "a client that reads nothing, before the stream ends (its engine work is aborted) and "
        "such a connection is dropped.",
    )
    stream_ping_after: float = Field(
        default=5.0,
        gt=0,
        description="Anthropic's Messages API: seconds a stream waits for its first token "
        "before it begins anyway, with `message_start`, then a `ping` event every as many "
        "seconds until the token comes (an error from then on is an `error` event, and no "
        "fallback is taken).",
    )

    # --- structured outputs ----------------------------------------------------------
    structured_compact_whitespace: bool = Field(
        default=True,
        description="JSON grammars (`json_schema`, `json_object`) allow no whitespace between "
        "tokens, so the model ends the JSON instead of padding it with blanks up to the token "
        "limit. vLLM applies it engine-wide (its xgrammar backend).",
    )
    max_schema_bytes: int = Field(
        default=32 * 1024,
        ge=64,
        description="Largest JSON schema accepted (`response_format.json_schema.schema`, "
        "`structured_outputs.json`), in bytes of compact JSON. vLLM parses it on the event "
        "loop for every request.",
    )
    max_schema_depth: int = Field(
        default=32,
        ge=2,
        le=64,
        description="Deepest nesting of objects and arrays in a JSON schema document (vLLM "
        "refuses beyond 64; converting it grows steeply with depth).",
    )
    max_regex_length: int = Field(
        default=4096, ge=1, description="Longest `structured_outputs.regex`, in characters."
    )
    max_grammar_bytes: int = Field(
        default=32 * 1024, ge=16, description="Largest `structured_outputs.grammar`, in bytes."
    )
    max_choices: int = Field(
        default=256, ge=1, description="Most strings in `structured_outputs.choice`."
    )
    max_choice_length: int = Field(
        default=1024, ge=1, description="Longest string in `structured_outputs.choice`."
    )

    # --- token budget ----------------------------------------------------------------
    truncation: Truncation = Field(
        default="auto",
        description="Chat requests that leave the completion less than its minimum: `auto` "
        "truncates the conversation, `disabled` answers 400. A request's `truncation` wins.",
    )
    completion_truncation: Truncation = Field(
        default="disabled",
        description="The same for /v1/completions: `auto` cuts the start of a prompt that is "
        "too long and keeps its end.",
    )
    budget_reserve_ratio: float = Field(
        default=0.3,
        ge=0,
        lt=1,
        description="Without a client max_tokens, the share of the context left after the "
        "prompt that the completion does not get.",
    )
    budget_default_max_tokens: int = Field(
        default=4096, ge=1, description="Most tokens a completion gets without a max_tokens."
    )
    budget_min_completion_tokens: int = Field(
        default=16,
        ge=1,
        description="Completion tokens the prompt must always leave (or the client's smaller "
        "max_tokens); a longer prompt is truncated.",
    )
    max_tokens_overflow: Overflow = Field(
        default="clamp",
        description="A max_tokens above what the context leaves: `clamp` lowers it, `error` "
        "answers 400 context_length_exceeded.",
    )

    # --- engine ----------------------------------------------------------------------
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one model is split over.")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="Pipeline stages.")
    data_parallel_size: int = Field(
        default=1,
        ge=1,
        description="Engine copies (each of TENSOR_PARALLEL_SIZE × PIPELINE_PARALLEL_SIZE "
        "workers) behind this one gateway, which vLLM balances requests over.",
    )
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        default=None,
        description="How vLLM starts its workers: `mp` (processes on this host) or `ray` (a "
        "Ray cluster, for models over several hosts; needs `ray` installed and a GPU build: "
        "vLLM's CPU build refuses it). Unset: vLLM chooses (`mp` on one host).",
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of GPU memory vLLM may take (0-1]."
    )
    max_num_seqs: int = Field(default=256, ge=1, description="Sequences batched per step.")
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="Tokens scheduled per step."
    )
    max_model_len: int = Field(
        default=4096, ge=16, description="Context window: prompt plus completion tokens."
    )
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV blocks of prefixes.")
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="Engine queue order. `priority`: by the API key's priority "
        "(KEY_PRIORITIES), then the request's own `priority` plus the sequences its key has in "
        "flight (lower first).",
    )
    key_priorities: dict[str, KeyPriority] = Field(
        default_factory=dict,
        description='JSON: {"<key id>": N}, N within ±1000. Under SCHEDULING_POLICY=priority, '
        "the engine schedules every request of a key with a lower N before any of a key with "
        "a higher one (default 0).",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="Weights and activations. `auto`: float32 on CPU."
    )
    enforce_eager: bool | None = Field(
        default=None,
        description="Skip graph compilation. Unset: on for CPU, off for GPU.",
    )
    cpu_kvcache_space_gib: int | None = Field(
        default=4,
        ge=1,
        description="CPU backend only: GiB reserved for the KV cache (VLLM_CPU_KVCACHE_SPACE); "
        "raise it on large hosts.",
    )

    @field_validator("lora_modules")
    @classmethod
    def _lora_parse(cls, value: str) -> str:
        parse_lora_modules(value)  # raises AdapterError (a ValueError)
        return value

    @field_validator("lora_roots")
    @classmethod
    def _lora_roots(cls, value: str) -> str:
        parse_lora_roots(value)  # raises AdapterError (a ValueError)
        return value

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return value

    @field_validator("api_keys", "admin_api_keys", "metrics_api_keys")
    @classmethod
    def _keys_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            ApiKeyring.parse(value.get_secret_value())  # raises ApiKeyError (a ValueError)
        return value

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins_parse(cls, value: str) -> str:
        for origin in (o.strip() for o in value.split(",")):
            if origin and origin != "*" and not _ORIGIN.fullmatch(origin.rstrip("/")):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port], "
                    "as a browser sends it in the Origin header"
                )
        return value

    @field_validator("upstream_urls")
    @classmethod
    def _upstreams_parse(cls, value: str) -> str:
        for url in (u.strip() for u in value.split(",")):
            if url and not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?/v1/?", url):
                raise ValueError(
                    f"{redact_url(url)!r} is not a base URL ending in /v1 (http[s]://host/v1)"
                )
        return value

    @model_validator(mode="after")
    def _check_ranges(self) -> Settings:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be at least max_num_seqs "
                f"({self.max_num_batched_tokens} < {self.max_num_seqs})"
            )
        if self.cache_ttl_min_seconds > self.cache_ttl_max_seconds:
            raise ValueError("cache_ttl_min_seconds must not exceed cache_ttl_max_seconds")
        if self.cache_ttl_fast_latency > self.cache_ttl_slow_latency:
            raise ValueError("cache_ttl_fast_latency must not exceed cache_ttl_slow_latency")
        weights = [w for w in self.upstream_weights.split(",") if w.strip()]
        urls = [u for u in self.upstream_urls.split(",") if u.strip()]
        if weights and len(weights) != len(urls):
            raise ValueError(
                f"upstream_weights has {len(weights)} values for {len(urls)} upstream_urls"
            )
        for weight in weights:
            try:
                positive = float(weight) > 0
            except ValueError:
                positive = False
            if not positive:
                raise ValueError(f"upstream weight {weight.strip()!r} is not a positive number")
        if self.responses_max_bytes_per_key < self.responses_max_entry_bytes:
            raise ValueError(
                "responses_max_bytes_per_key must be at least responses_max_entry_bytes "
                f"({self.responses_max_bytes_per_key} < {self.responses_max_entry_bytes})"
            )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras must be at least max_loras ({self.max_cpu_loras} < "
                f"{self.max_loras})"
            )
        if self.workers > 1:
            self._check_workers()
        if self.allow_runtime_lora and not self.lora_root_folders:
            raise ValueError(
                "allow_runtime_lora needs SLUICEGATE_LORA_ROOTS: the folders adapters may be "
                "loaded from at run time"
            )
        if self.managed_keys:
            self._check_managed_keys()
        if self.budget_min_completion_tokens >= self.max_model_len:
            raise ValueError(
                "budget_min_completion_tokens must be below max_model_len "
                f"({self.budget_min_completion_tokens} >= {self.max_model_len})"
            )
        return self

    def _check_workers(self) -> None:
        """What several workers cannot do: a stored response (the Responses API) must be found
        by whichever worker gets the conversation's next turn, so it needs Redis; and an adapter
        loaded at run time would be known to one worker's engine client only (vLLM refuses
        runtime LoRA with several API servers for the same reason)."""
        if self.redis_url is None:
            raise ValueError(
                f"workers={self.workers} needs SLUICEGATE_REDIS_URL: stored responses (the "
                "Responses API's previous_response_id) must be found by whichever worker serves "
                "the next turn, and each worker's memory is its own"
            )
        if self.allow_runtime_lora:
            raise ValueError(
                f"allow_runtime_lora cannot be used with workers={self.workers}: an adapter "
                "loaded through the API would be known to one worker only; list adapters in "
                "SLUICEGATE_LORA_MODULES instead"
            )

    def _check_managed_keys(self) -> None:
        if self.redis_url is None:
            raise ValueError("managed_keys needs SLUICEGATE_REDIS_URL: the keys are kept there")
        if self.admin_api_keys is None:
            raise ValueError(
                "managed_keys needs SLUICEGATE_ADMIN_API_KEYS: only admin keys may manage keys"
            )

    def keyring(self) -> ApiKeyring:
        """The keys of the settings: API keys and admin keys, on one ring."""
        keys, admin = self.api_keys, self.admin_api_keys
        return ApiKeyring.of(
            None if keys is None else keys.get_secret_value(),
            None if admin is None else admin.get_secret_value(),
        )

    def metrics_keyring(self) -> ApiKeyring:
        """The keys of scrapers (`METRICS_API_KEYS`): good for the metrics alone."""
        keys = self.metrics_api_keys
        return ApiKeyring(()) if keys is None else ApiKeyring.parse(keys.get_secret_value())

    @property
    def keyed(self) -> bool:
        """Every request needs an API key (API_KEYS, or managed keys)."""
        return self.api_keys is not None or self.managed_keys

    @property
    def upstreams(self) -> list[tuple[str, float]]:
        """The upstream base URLs (no trailing slash), each with its weight."""
        urls = [u.strip().rstrip("/") for u in self.upstream_urls.split(",") if u.strip()]
        weights = [w.strip() for w in self.upstream_weights.split(",") if w.strip()]
        if not weights:
            return [(u, 1.0) for u in urls]
        return list(zip(urls, (float(w) for w in weights), strict=True))

    @property
    def embedding_name(self) -> str | None:
        """The in-process embedding engine's name, when there is one."""
        if self.embedding_model is None:
            return None
        if self.embedding_served_name:
            return self.embedding_served_name
        if self.embedding_model == "bundled":
            return f"{DEFAULT_MODEL_NAME}-embed"
        name = Path(self.embedding_model.rstrip("/")).name or self.embedding_model
        return f"{name}-embed"

    @property
    def lora_root_folders(self) -> tuple[str, ...]:
        return parse_lora_roots(self.lora_roots)

    @property
    def lora_enabled(self) -> bool:
        return bool(self.lora_modules.strip()) or self.allow_runtime_lora

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.cors_allow_origins.split(",") if o.strip()]

    @property
    def playground_enabled(self) -> bool:
        if self.playground is not None:
            return self.playground
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name
            return False

    @property
    def model_name(self) -> str:
        """The name clients use in `model` and see in responses."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return DEFAULT_MODEL_NAME
        return Path(self.model.rstrip("/")).name or self.model


def redact_url(url: str) -> str:
    """A URL as it may be shown: what comes before an `@` (a user and password) and its
    query or fragment (which can hold a token) replaced by `***`. Read from the raw text,
    not parsed: a URL too broken to parse may hold credentials too."""
    url = url.strip()
    cut = re.search(r"[?#]", url)
    head = url if cut is None else url[: cut.start()]
    scheme = head.find("://")
    start = scheme + 3 if scheme >= 0 else 0
    at = head.rfind("@", start)
    if at >= 0:
        head = head[:start] + "***" + head[at:]
    return head if cut is None else head + "?***"


def describe_error(exc: ValidationError) -> str:
    """One line per bad value, naming the setting as users spell it in the environment."""
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        name = (ENV_PREFIX + loc[0].upper()) if loc else "settings"
        allowed = ""
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            allowed = f" (allowed: {ctx['expected']})"
        given = err.get("input")
        if loc and loc[0] == "upstream_urls" and isinstance(given, str):
            given = ",".join(redact_url(url) for url in given.split(","))
        secret = bool(loc) and loc[0] in SECRET_SETTINGS
        shown = f"={given!r}" if loc and not secret and not isinstance(given, dict) else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"invalid setting {name}{shown}: {msg}{allowed}")
    return "\n".join(lines)
