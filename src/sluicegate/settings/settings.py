"""The one `Settings` object: the settings of every concern composed, read from the
`SLUICEGATE_*` environment and a `.env` file, with the checks that span concerns."""

from __future__ import annotations

import ipaddress
from typing import Self

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluicegate.settings.access import AccessSettings
from sluicegate.settings.admission import AdmissionSettings
from sluicegate.settings.browsers import BrowserSettings
from sluicegate.settings.budget import BudgetSettings
from sluicegate.settings.cache import CacheSettings
from sluicegate.settings.engine import EngineSettings
from sluicegate.settings.media import MediaSettings
from sluicegate.settings.models import ModelSettings
from sluicegate.settings.rate_limits import RateLimitSettings
from sluicegate.settings.reasoning import ReasoningSettings
from sluicegate.settings.reporting import ENV_PREFIX
from sluicegate.settings.server import ServerSettings
from sluicegate.settings.traffic import TrafficSettings
from sluicegate.settings.upstream import UpstreamSettings


# pydantic takes the fields of the last base first: the concerns are listed last to first,
# so that the fields keep the order of docs/configuration.md (and of `serve --help`).
class Settings(
    EngineSettings,
    BudgetSettings,
    MediaSettings,
    AdmissionSettings,
    CacheSettings,
    RateLimitSettings,
    BrowserSettings,
    ReasoningSettings,
    AccessSettings,
    TrafficSettings,
    ServerSettings,
    UpstreamSettings,
    ModelSettings,
    BaseSettings,
):
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

    @model_validator(mode="after")
    def _check_across(self) -> Self:
        if self.slo_itl is not None and self.slo_ttft is None:
            raise ValueError(
                "SLUICEGATE_SLO_ITL needs SLUICEGATE_SLO_TTFT: the objective is judged on both"
            )
        if self.workers > 1:
            self._check_workers()
        # After the workers' check: with several workers, runtime adapters are refused
        # outright, which says more than that they need their folders.
        if self.allow_runtime_lora and not self.lora_root_folders:
            raise ValueError(
                "allow_runtime_lora needs SLUICEGATE_LORA_ROOTS: the folders adapters may be "
                "loaded from at run time"
            )
        if self.managed_keys:
            self._check_managed_keys()
        parser = self.reasoning_parser
        splits_upstreams = self.models_file is None and bool(self.upstreams)
        if splits_upstreams and parser and parser.lower() != "none" and self.tokenizer is None:
            raise ValueError(
                "reasoning_parser with upstream_urls needs SLUICEGATE_TOKENIZER: the parser "
                "reads the thinking markers by their token ids, in the model's own tokenizer"
            )
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
        runtime LoRA with several API servers for the same reason), as would admission bounds
        changed at run time."""
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
        if self.traffic_capture is not None:
            raise ValueError(
                f"traffic_capture cannot be used with workers={self.workers}: each worker "
                "would record its own requests in its own arrival order; capture with "
                "SLUICEGATE_WORKERS=1"
            )
        if self.allow_runtime_admission:
            raise ValueError(
                f"allow_runtime_admission cannot be used with workers={self.workers}: each "
                "worker holds its own admission bounds, and a change through the API would "
                "reach one worker only; tune a single worker, then give the bounds it found "
                "as settings"
            )

    def _check_managed_keys(self) -> None:
        if self.redis_url is None:
            raise ValueError("managed_keys needs SLUICEGATE_REDIS_URL: the keys are kept there")
        if self.admin_api_keys is None:
            raise ValueError(
                "managed_keys needs SLUICEGATE_ADMIN_API_KEYS: only admin keys may manage keys"
            )

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
