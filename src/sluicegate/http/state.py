"""What the lifespan hands to every request: one typed object instead of a bag of names.

Starlette copies the lifespan's state into each request's scope; `AppState` is stored there
under one key, and read back with `app_state(scope)` (middleware) or `api.deps` (routes).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from starlette.types import Scope

from sluicegate.cache.embedding_cache import EmbeddingCache
from sluicegate.cache.response_cache import ResponseCache
from sluicegate.conversation.store import ResponseStore
from sluicegate.inference.admission import Admission
from sluicegate.keys import ApiKeyring
from sluicegate.lifecycle import Lifecycle
from sluicegate.media.loader import MediaLoader
from sluicegate.models.registry import ModelRegistry
from sluicegate.observability.capture import TrafficCapture
from sluicegate.observability.key_label import KeyLabels
from sluicegate.observability.objective import ServiceObjective
from sluicegate.offload import ProcessOffload
from sluicegate.quota.quotas import Quotas
from sluicegate.tenancy.ledger import UsageLedger
from sluicegate.tenancy.store import KeyStore
from sluicegate.tenancy.usage import UsageReader
from sluicegate.wire.reasoning_seal import MIN_KEY_BYTES, ReasoningSeal

STATE_KEY = "sluicegate"


@dataclass(frozen=True, slots=True)
class Timeouts:
    request: float
    """Seconds one request, streamed or not, may take (504)."""
    stream_stall: float
    """Seconds a stream may go without an event before it ends."""
    ping_after: float = 5.0
    """Seconds a stream that opens with events of its own (Anthropic's) waits for its first
    output before it begins with them and pings instead (`keepalive`, if shorter)."""
    keepalive: float = 15.0
    """Seconds a stream may send nothing before it sends its keep-alive (a comment, a ping),
    mid-stream or before its first output (then it begins with it)."""


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call what: the keys the gateway was given."""

    keys: bool = False
    """API keys are set: every request needs one."""
    admin_keys: bool = False
    """Admin keys are set: only they may call the admin endpoints."""
    managed: bool = False
    """Keys are managed (`MANAGED_KEYS`): the metrics, whose series name keys and models,
    are for admin and scraper keys only."""

    @property
    def admin_guarded(self) -> bool:
        """The admin endpoints need an admin key (with API keys set, none may call them
        unless admin keys are set too)."""
        return self.keys or self.admin_keys


@dataclass(frozen=True, slots=True)
class AppState:
    models: ModelRegistry
    """Every name a request may give as `model`, and what serves it."""
    cache: ResponseCache
    embeddings: EmbeddingCache
    """Each input's embedding, in the response cache's store."""
    quotas: Quotas
    responses: ResponseStore
    """Stored responses of the Responses API."""
    lifecycle: Lifecycle
    timeouts: Timeouts
    processes: ProcessOffload
    """Where large request bodies are parsed (`api.route`)."""
    access: Access = Access()
    allow_runtime_lora: bool = False
    lora_roots: tuple[str, ...] = ()
    """The folders adapters may be loaded from at run time (`LORA_ROOTS`)."""
    admission: Admission = field(default_factory=Admission)
    """The admission bounds every engine's admission reads."""
    allow_runtime_admission: bool = False
    """An admin may change them at run time (`/admin/admission`)."""
    keys: KeyStore | None = None
    """Managed keys (`MANAGED_KEYS`): None without them."""
    static_keys: ApiKeyring = field(default_factory=lambda: ApiKeyring(()))
    """The keys of the settings (`API_KEYS`, `ADMIN_API_KEYS`), listed read-only."""
    ledger: UsageLedger | None = None
    """Where settled requests' usage goes (`USAGE_LEDGER`, with Redis)."""
    usage: UsageReader | None = None
    key_labels: KeyLabels = field(default_factory=KeyLabels)
    """The bounded `key` label of the per-key metrics."""
    reasoning_seal: ReasoningSeal = field(
        default_factory=lambda: ReasoningSeal((secrets.token_bytes(MIN_KEY_BYTES),))
    )
    """Signs thinking blocks and seals reasoning items (`wiring.reasoning`)."""
    media: MediaLoader = field(default_factory=MediaLoader.default)
    """Reads the images of requests (`wiring.media`)."""
    capture: TrafficCapture | None = None
    """Records the traffic profile (`TRAFFIC_CAPTURE`); None when off."""
    objective: ServiceObjective | None = None
    """The service objective requests are judged against (`SLO_TTFT`); None when unset."""

    def lifespan_state(self) -> dict[str, AppState]:
        """What the lifespan yields."""
        return {STATE_KEY: self}


def app_state(scope: Scope) -> AppState | None:
    """The app's state, or None outside the lifespan (it has not started, or has ended)."""
    state = scope.get("state") or {}
    found = state.get(STATE_KEY)
    return found if isinstance(found, AppState) else None
