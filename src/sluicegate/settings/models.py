"""Models and adapters: which model is served and under what name, the models file, LoRA
adapters, and the in-process embedding engine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, FilePath, field_validator, model_validator

from sluicegate.engine.lora import VLLM_LORA_RANKS, parse_lora_modules, parse_lora_roots
from sluicegate.engine.model import DEFAULT_MODEL_NAME


def _default_model_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluicegate" / "models"


class ModelSettings(BaseModel):
    """The model, its adapters and the embedding engine."""

    model_config = ConfigDict(protected_namespaces=())

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
    reasoning_parser: str | None = Field(
        default=None,
        description="vLLM reasoning parser that splits the in-process model's thoughts from "
        "its answer in chat answers (`message.reasoning`, `delta.reasoning`, "
        "`usage.completion_tokens_details.reasoning_tokens`), as vLLM's `--reasoning-parser`: "
        "`deepseek_r1`, `qwen3`, `step3`, ... (it must match the model's chat template), or "
        "`none`. The engine gets it too: structured outputs constrain the answer only, and "
        "`thinking_token_budget` works. With UPSTREAM_URLS, the gateway splits the upstreams' "
        "content with it (needs TOKENIZER); models file entries take `reasoning_parser:`. "
        "Unset: none (thoughts stay in the content).",
    )
    reasoning_parser_plugin: FilePath | None = Field(
        default=None,
        description="A Python file that registers reasoning parsers of your own with vLLM's "
        "`ReasoningParserManager` (vLLM's `--reasoning-parser-plugin`): their names are then "
        "taken by REASONING_PARSER and the models file's `reasoning_parser:`. Loaded in the "
        "gateway and in the engine core; a file that fails to import stops start-up.",
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

    @model_validator(mode="after")
    def _check_loras(self) -> Self:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras must be at least max_loras ({self.max_cpu_loras} < "
                f"{self.max_loras})"
            )
        return self

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
    def model_name(self) -> str:
        """The name clients use in `model` and see in responses."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return DEFAULT_MODEL_NAME
        return Path(self.model.rstrip("/")).name or self.model
