"""`GET` and `PUT /admin/admission`: the admission bounds (`TTFT_OBJECTIVE`,
`MAX_ENGINE_WAITING`, `MAX_ENGINE_RUNNING`, `MAX_KV_CACHE_USAGE`) read and changed at run
time, for the requests that come after, with no restart (`inference.admission`; what
`sluicegate tune` searches).

Both answer the four bounds as they are then (`null`: unset), which `PUT` takes back as its
body: a field sent sets its bound, `null` unsets it, one left out keeps it
(`wire.admission`). `POST /admin/admission/reset` keeps the bounds and forgets what the
engines' queues measured for `TTFT_OBJECTIVE` (their drain rates, the lateness of first
tokens), and answers the bounds too. Answered only with `SLUICEGATE_ALLOW_RUNTIME_ADMISSION`
(404 otherwise), and with keys set, only for admin keys: `http.admin_guard` checks both
before the body is read, and counts the call against the key's admin limit.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sluicegate.api.deps import AdminDep, KeyIdDep, StateDep
from sluicegate.errors import NotFoundError
from sluicegate.http.admin_guard import RUNTIME_ADMISSION_OFF
from sluicegate.http.state import AppState
from sluicegate.inference.admission import Admission
from sluicegate.wire.admission import AdmissionBounds

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


@router.get("/admission")
async def get_admission(state: StateDep) -> dict[str, Any]:
    return _admission(state).bounds.model_dump()


@router.put("/admission")
async def set_admission(body: AdmissionBounds, state: StateDep, key: KeyIdDep) -> dict[str, Any]:
    return _admission(state).change(body, by=key).model_dump()


@router.post("/admission/reset")
async def reset_admission(state: StateDep, key: KeyIdDep) -> dict[str, Any]:
    admission = _admission(state)
    admission.forget(by=key)
    return admission.bounds.model_dump()


def _admission(state: AppState) -> Admission:
    if not state.allow_runtime_admission:
        raise NotFoundError(RUNTIME_ADMISSION_OFF)
    return state.admission
