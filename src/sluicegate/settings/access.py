"""Keys and usage: API, admin and scraper keys, managed keys, the usage ledger and the
prices it charges."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from sluicegate.keys import ApiKeyring
from sluicegate.models.config import ModelPrice


class AccessSettings(BaseModel):
    """Who may call the gateway, and what their calls are recorded as."""

    model_config = ConfigDict(protected_namespaces=())

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

    @field_validator("api_keys", "admin_api_keys", "metrics_api_keys")
    @classmethod
    def _keys_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            ApiKeyring.parse(value.get_secret_value())  # raises ApiKeyError (a ValueError)
        return value

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
