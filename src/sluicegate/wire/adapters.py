"""`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` bodies, as vLLM's server takes them."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from sluicegate.engine.lora import MAX_NAME_LENGTH, check_adapter_name
from sluicegate.wire.requests import RequestModel

AdapterName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH), AfterValidator(check_adapter_name)
]
"""A model name: printable, no spaces, not starting with `/`, at most 256 characters."""


def _printable(path: str) -> str:
    if not path.isprintable():
        raise ValueError("a path is printable characters only (no control characters)")
    return path


AdapterPath = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_printable)]


class LoadAdapterRequest(RequestModel):
    lora_name: AdapterName
    lora_path: AdapterPath


class UnloadAdapterRequest(RequestModel):
    lora_name: AdapterName
    lora_int_id: int | None = None
    """Taken, as vLLM takes it, and not used: adapters are unloaded by name."""
