"""The in-process engine: parallelism, memory, batching, scheduling and precision of
vLLM."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, model_validator

KEY_PRIORITY_BOUND = 1000
"""API key priorities are within ± this (`KEY_PRIORITIES`)."""


KeyPriority = Annotated[int, Field(ge=-KEY_PRIORITY_BOUND, le=KEY_PRIORITY_BOUND)]


class EngineSettings(BaseModel):
    """How the in-process vLLM engine runs."""

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
    long_prefill_token_threshold: int = Field(
        default=0,
        ge=0,
        description="At most this many of one prompt's tokens prefilled per step (the rest "
        "in the next steps), so that a long prompt shares each step with the sequences "
        "already decoding. 0: no bound but MAX_NUM_BATCHED_TOKENS.",
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

    @model_validator(mode="after")
    def _check_batch(self) -> Self:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be at least max_num_seqs "
                f"({self.max_num_batched_tokens} < {self.max_num_seqs})"
            )
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(
                "long_prefill_token_threshold must be at most max_model_len "
                f"({self.long_prefill_token_threshold} > {self.max_model_len})"
            )
        return self
