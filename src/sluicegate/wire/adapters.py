"""`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` bodies, as vLLM's server takes them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sluicegate.wire.requests import RequestModel

AdapterName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s/][^\s]*$")]


class LoadAdapterRequest(RequestModel):
    lora_name: AdapterName
    lora_path: Annotated[str, Field(min_length=1, max_length=4096)]


class UnloadAdapterRequest(RequestModel):
    lora_name: AdapterName
    lora_int_id: int | None = None
    """Taken, as vLLM takes it, and not used: adapters are unloaded by name."""
