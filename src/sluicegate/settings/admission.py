"""Admission: how much load is let in (requests in flight, engine queue, per-key shares),
how large and how slow a request may be, and the bounds on structured outputs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sluicegate.wire.requests import MAX_MESSAGES, MAX_N, MAX_PROMPTS


class AdmissionSettings(BaseModel):
    """What a request may hold and take, and when the gateway refuses more."""

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
    allow_runtime_admission: bool = Field(
        default=False,
        description="Lets admin keys read and change TTFT_OBJECTIVE, MAX_ENGINE_WAITING, "
        "MAX_ENGINE_RUNNING and MAX_KV_CACHE_USAGE at run time, with no restart (`GET` and "
        "`PUT /admin/admission`), for the requests that come after: what `sluicegate tune` "
        "searches; and forget what the TTFT estimate measured (`POST "
        "/admin/admission/reset`). Off: those routes answer 404. Refused with WORKERS > 1: "
        "each worker holds its own bounds, and a change would reach one of them.",
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
        description="Seconds a stream may go without output from its engine (thoughts left "
        "out of the answer count as output), or a write may stay blocked by a client that "
        "reads nothing, before the stream ends (its engine work is aborted) and such a "
        "connection is dropped.",
    )
    stream_ping_after: float = Field(
        default=5.0,
        gt=0,
        description="Anthropic's Messages API: seconds a stream waits for its first token "
        "before it begins anyway (or `stream_keepalive_interval`, if shorter), with "
        "`message_start`, then a `ping` event every as many seconds until the token comes (an "
        "error from then on is an `error` event, and no fallback is taken).",
    )
    stream_keepalive_interval: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a stream may send nothing before it sends a keep-alive: an SSE "
        "comment (`: keep-alive`, which SSE clients ignore) on the OpenAI APIs, a `ping` event "
        "on Anthropic's Messages API. Mid-stream (a model thinking with its thoughts left out, "
        "a long prefill, a slow upstream) and before the first token: an OpenAI stream then "
        "begins (its 200, then the comment; an error from then on is an error event, and no "
        "fallback is taken). Keep it under the idle timeout of the proxies in front (60 s for "
        "nginx's `proxy_read_timeout` and AWS ALB's). Keep-alives are not output: "
        "`stream_stall_timeout` still ends a stream whose engine sends nothing.",
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
