"""`POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`: LoRA adapters of the
in-process engine loaded and unloaded at run time, with vLLM's bodies and answers.

Answered only with `SLUICEGATE_ALLOW_RUNTIME_LORA` (404 otherwise, as vLLM's server has no
such routes then), and with keys set, only for admin keys: `http.admin_guard` checks both
before the body is read, and counts the call against the key's admin limit. An adapter is
loaded only from inside `SLUICEGATE_LORA_ROOTS` (symlinks resolved). A loaded adapter is a
model of the registry at once; an unloaded one is gone at once, while the requests running on
it finish (`engine.vllm_adapters`).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from sluicegate.api.deps import AdminDep, StateDep
from sluicegate.errors import NotFoundError
from sluicegate.http.admin_guard import RUNTIME_LORA_OFF
from sluicegate.http.state import AppState
from sluicegate.wire.adapters import LoadAdapterRequest, UnloadAdapterRequest

router = APIRouter(prefix="/v1", tags=["adapters"], dependencies=[AdminDep])


@router.post("/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadAdapterRequest, state: StateDep) -> str:
    _check_allowed(state)
    await state.models.load_adapter(body.lora_name, body.lora_path, state.lora_roots)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadAdapterRequest, state: StateDep) -> str:
    _check_allowed(state)
    state.models.unload_adapter(body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


def _check_allowed(state: AppState) -> None:
    if not state.allow_runtime_lora:
        raise NotFoundError(RUNTIME_LORA_OFF)
