"""The model registry's file (`SLUICEGATE_MODELS_FILE`): what each name serves, checked whole.

    models:
      - name: llama-8b
        aliases: [default, gpt-4o-mini]
        upstreams:
          - {url: http://10.0.0.1:8000/v1, weight: 2}
          - url: http://10.0.0.2:8000/v1
        api_key_env: LLAMA_KEY
        tokenizer: /models/llama-8b
        fallbacks: [qwen-7b]
        price: {input: 0.15, output: 0.6}   # per million tokens: the ledger's cost
      - name: qwen-7b
        upstreams: [{url: http://10.0.0.3:8000/v1}]
      - name: smol
        engine: local

Every mistake the file can hold stops start-up with a message naming the entry: an unknown key,
a name or alias given twice, a fallback that names nothing or leads back to itself, an entry
with both or neither of `upstreams` and `engine: local`, two local entries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sluicegate.prices import Price

_URL = re.compile(r"https?://[^\s/]+(/[^\s]*)?/v1/?")
_NAME = re.compile(r"[^\s/][^\s]{0,255}")
"""A model name: no whitespace, not starting with `/` (vLLM's names may hold `/`: org/model)."""


class ModelsFileError(ValueError):
    """The models file cannot be used; the message says where and why."""


class ModelRateLimit(BaseModel):
    """Limits on one model across every key (each key's own limits apply too)."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class ModelPrice(BaseModel):
    """What a model's tokens cost, per million (in one currency, the same for every model):
    the usage ledger's `cost`, and budgets given in cost."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    input: float = Field(ge=0)
    output: float = Field(ge=0)

    def price(self) -> Price:
        return Price(self.input, self.output)


class UpstreamEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    weight: float = Field(default=1.0, gt=0)

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        if not _URL.fullmatch(value.strip()):
            raise ValueError("is not a base URL ending in /v1 (http[s]://host/v1)")
        return value.strip().rstrip("/")


class ModelEntry(BaseModel):
    """One name the gateway serves: a pool of upstreams, or the in-process engine."""

    model_config = ConfigDict(extra="forbid")
    name: str
    aliases: list[str] = []
    upstreams: list[UpstreamEntry] = []
    engine: Literal["local"] | None = None
    """`local`: the in-process engine, `name` being its served name."""
    api_key_env: str | None = None
    """The environment variable holding the key sent to this entry's upstreams."""
    tokenizer: str | None = None
    """A tokenizer folder or hub id for the token budget (upstreams only)."""
    reasoning_parser: str | None = None
    """vLLM's reasoning parser by name, for upstreams that send their thoughts inside the
    content (`<think>...</think>`): the gateway splits them as vLLM's server would, with the
    entry's `tokenizer` (upstreams only; the in-process engine takes
    SLUICEGATE_REASONING_PARSER)."""
    upstream_model: str | None = None
    """The model name sent upstream; unset: the one the upstreams list first."""
    max_model_len: int | None = Field(default=None, ge=16)
    """The context window when the upstreams do not say (vLLM's `/v1/models` does)."""
    images: bool = True
    """Whether the upstreams' model reads images; false: a request with one gets a 400
    before anything is fetched (upstreams only: the local model says so itself)."""
    fallbacks: list[str] = []
    rate_limit: ModelRateLimit | None = None
    price: ModelPrice | None = None
    kind: Literal["chat", "embedding", "rerank"] = "chat"
    """What the model serves: chat and text completions (and the Messages API); embeddings
    (and rerank and score from them); or rerank and score from a cross-encoder, asked of
    the upstreams as they come."""

    @field_validator("name", "aliases", "fallbacks", mode="after")
    @classmethod
    def _names(cls, value: str | list[str]) -> str | list[str]:
        for name in [value] if isinstance(value, str) else value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a model name (no spaces, at most 256 chars)")
        return value

    @property
    def is_local(self) -> bool:
        return self.engine == "local"


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[ModelEntry] = Field(min_length=1)


def parse_models_file(text: str, source: str = "the models file") -> list[ModelEntry]:
    """The entries of a models file's YAML text, checked alone and together."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelsFileError(f"{source} is not valid YAML: {exc}") from None
    try:
        models = ModelsFile.model_validate(data).models
    except ValidationError as exc:
        raise ModelsFileError(f"{source}: {_describe(exc, data)}") from None
    check_entries(models, source)
    return models


def check_entries(
    entries: list[ModelEntry], source: str = "the models file", reserved: Iterable[str] = ()
) -> None:
    """What the entries must be together. `reserved`: names already served otherwise (the
    in-process engine's adapters), which no entry or alias may take."""
    owners: dict[str, str] = {name: "an adapter" for name in reserved}
    for entry in entries:
        where = f"{source}, model {entry.name!r}"
        if entry.is_local == bool(entry.upstreams):
            raise ModelsFileError(f"{where}: give either `upstreams` or `engine: local`")
        if entry.is_local and entry.kind != "chat":
            raise ModelsFileError(
                f"{where}: the in-process embedding engine is SLUICEGATE_EMBEDDING_MODEL's, "
                "not an entry's"
            )
        if entry.is_local and (
            entry.tokenizer
            or entry.upstream_model
            or entry.api_key_env
            or entry.reasoning_parser
            or not entry.images
        ):
            raise ModelsFileError(
                f"{where}: tokenizer, upstream_model, api_key_env, reasoning_parser and images "
                "are for upstreams; the local engine is configured by the SLUICEGATE_* engine "
                "settings"
            )
        if entry.reasoning_parser is not None and entry.kind != "chat":
            raise ModelsFileError(f"{where}: reasoning_parser is for chat models")
        if entry.reasoning_parser is not None and entry.tokenizer is None:
            raise ModelsFileError(
                f"{where}: reasoning_parser needs the model's `tokenizer` (its parser reads "
                "the thinking markers by their token ids)"
            )
        for name in (entry.name, *entry.aliases):
            if name in owners:
                raise ModelsFileError(f"{where}: {name!r} is already the name of {owners[name]}")
            owners[name] = f"model {entry.name!r}" if name == entry.name else (
                f"an alias of model {entry.name!r}"
            )  # fmt: skip
    locals_ = [e.name for e in entries if e.is_local]
    if len(locals_) > 1:
        raise ModelsFileError(f"{source}: one in-process engine at most; {locals_} all ask for it")
    by_name = {e.name: e for e in entries}
    for entry in entries:
        for fallback in entry.fallbacks:
            if fallback not in by_name:
                alias_of = owners.get(fallback)
                hint = f" ({fallback!r} is {alias_of}: name the model)" if alias_of else ""
                raise ModelsFileError(
                    f"{source}, model {entry.name!r}: fallback {fallback!r} is no model{hint}"
                )
            if entry.kind != "chat":
                raise ModelsFileError(
                    f"{source}, model {entry.name!r}: an embedding model takes no fallbacks "
                    "(another model's vectors are in another space)"
                )
            if by_name[fallback].kind != entry.kind:
                raise ModelsFileError(
                    f"{source}, model {entry.name!r}: fallback {fallback!r} serves "
                    f"{by_name[fallback].kind}, not {entry.kind}"
                )
    for entry in entries:
        cycle = _cycle_from(entry.name, by_name)
        if cycle:
            raise ModelsFileError(
                f"{source}, model {entry.name!r}: its fallbacks lead back to it "
                f"({' -> '.join(cycle)})"
            )


def _cycle_from(start: str, by_name: Mapping[str, ModelEntry]) -> list[str]:
    """A path of fallbacks from `start` back to it, or [] if there is none."""
    path: list[str] = [start]
    seen: set[str] = set()

    def walk(name: str) -> bool:
        for fallback in by_name[name].fallbacks:
            if fallback == start:
                path.append(fallback)
                return True
            if fallback in seen:
                continue
            seen.add(fallback)
            path.append(fallback)
            if walk(fallback):
                return True
            path.pop()
        return False

    return path if walk(start) else []


def _describe(exc: ValidationError, data: Any) -> str:
    """The first error, named by the entry it is in (`models[2]` is shown as its name)."""
    err = exc.errors()[0]
    loc = list(err["loc"])
    where = ".".join(str(p) for p in loc)
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
        entries = data.get("models") if isinstance(data, dict) else None
        entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"model {name!r}" if isinstance(name, str) else f"models[{loc[1]}]"
        rest = ".".join(str(p) for p in loc[2:])
        where = f"{label}, {rest}" if rest else label
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"
