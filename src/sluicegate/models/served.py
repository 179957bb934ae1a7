"""One name the gateway serves, and what serving it takes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sluicegate.engine.protocol import EmbeddingEngine, EngineClient
from sluicegate.inference.embeddings import EmbeddingService
from sluicegate.inference.service import CompletionService
from sluicegate.quota.quotas import ModelQuota
from sluicegate.wire.formats import ModelCard


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model as requests reach it: its service (one engine, one tokenizer, one window), and
    what the registry knows about it. An adapter is a served model of its own, on its base
    model's engine."""

    name: str
    service: CompletionService
    root: str
    """The model behind the name (the card's `root`): a folder, a hub id, an upstream's id, an
    adapter's path."""
    created: int
    """Unix time it became servable (the card's `created`)."""
    parent: str | None = None
    """An adapter's base model (the card's `parent`)."""
    fallbacks: tuple[str, ...] = ()
    """Models that answer in its place when it cannot, in order."""
    quota: ModelQuota | None = None
    """Limits on the model across every key; None: none."""
    local: bool = False
    """Served by the in-process engine (its base model or one of its adapters)."""

    @property
    def engine(self) -> EngineClient:
        return self.service.engine

    def card(self) -> ModelCard:
        """Its entry in `/v1/models` (OpenAI's model object, with vLLM's fields)."""
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "sluicegate",
            "root": self.root,
            "parent": self.parent,
            "max_model_len": self.engine.max_model_len,
        }


Forward = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class ServedEmbedder:
    """An embedding model as requests reach it: its service (one engine, one tokenizer, one
    window) and its card."""

    name: str
    service: EmbeddingService
    root: str
    created: int
    quota: ModelQuota | None = None
    local: bool = False
    forward: Forward | None = None
    """For a pool of cross-encoders (`kind: rerank`): asks its upstreams a request as it is
    (`path`, `body`), for rerank and score."""

    @property
    def engine(self) -> EmbeddingEngine:
        return self.service.engine

    def card(self) -> ModelCard:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "sluicegate",
            "root": self.root,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
        }
