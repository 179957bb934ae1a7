"""Upstream mode: the OpenAI-compatible servers requests go to, and how the gateway
connects to them, retries, breaks and probes them, and spreads prompts over them."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from sluicegate.settings.reporting import redact_url


class UpstreamSettings(BaseModel):
    """The upstream servers and the client that talks to them."""

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
    def _check_weights(self) -> Self:
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
        return self

    @property
    def upstreams(self) -> list[tuple[str, float]]:
        """The upstream base URLs (no trailing slash), each with its weight."""
        urls = [u.strip().rstrip("/") for u in self.upstream_urls.split(",") if u.strip()]
        weights = [w.strip() for w in self.upstream_weights.split(",") if w.strip()]
        if not weights:
            return [(u, 1.0) for u in urls]
        return list(zip(urls, (float(w) for w in weights), strict=True))
