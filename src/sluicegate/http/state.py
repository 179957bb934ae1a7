"""What the lifespan hands to every request: one typed object instead of a bag of names.

Starlette copies the lifespan's state into each request's scope; `AppState` is stored there
under one key, and read back with `app_state(scope)` (middleware) or `api.deps` (routes).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import Scope

from sluicegate.cache.response_cache import ResponseCache
from sluicegate.conversation.store import ResponseStore
from sluicegate.engine.protocol import EngineClient
from sluicegate.inference.service import CompletionService
from sluicegate.lifecycle import Lifecycle
from sluicegate.offload import ProcessOffload
from sluicegate.quota.quotas import Quotas

STATE_KEY = "sluicegate"


@dataclass(frozen=True, slots=True)
class Timeouts:
    request: float
    """Seconds one request, streamed or not, may take (504)."""
    stream_stall: float
    """Seconds a stream may go without an event before it ends."""


@dataclass(frozen=True, slots=True)
class AppState:
    engine: EngineClient
    service: CompletionService
    cache: ResponseCache
    quotas: Quotas
    responses: ResponseStore
    """Stored responses of the Responses API."""
    lifecycle: Lifecycle
    timeouts: Timeouts
    processes: ProcessOffload
    """Where large request bodies are parsed (`api.route`)."""
    model_name: str
    """The name clients pass as `model`."""
    model_root: str
    """The model folder or hub id behind it."""
    started_at: int
    """Unix time the engine became ready (the model card's `created`)."""

    def lifespan_state(self) -> dict[str, AppState]:
        """What the lifespan yields."""
        return {STATE_KEY: self}


def app_state(scope: Scope) -> AppState | None:
    """The app's state, or None outside the lifespan (it has not started, or has ended)."""
    state = scope.get("state") or {}
    found = state.get(STATE_KEY)
    return found if isinstance(found, AppState) else None
