"""`/admin/keys`: managed API keys, created, read, changed and revoked at run time
(`tenancy.store`; `docs/keys.md`). Admin keys only (`AdminDep`).

`POST` answers the new key's secret once, in `key`; nothing else ever shows it. The keys of
the settings (`API_KEYS`, `ADMIN_API_KEYS`) are listed beside the managed ones, read-only.
Without `MANAGED_KEYS` these routes answer 404; with Redis down, 503 `store_unavailable`.
`POST /admin/keys/restore` writes back the keys this process kept when Redis lost them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sluicegate.api.deps import AdminDep, StateDep
from sluicegate.errors import InvalidRequestError, NotFoundError
from sluicegate.http.admin_guard import MANAGED_KEYS_OFF
from sluicegate.http.state import AppState
from sluicegate.keys import key_id
from sluicegate.tenancy.records import static_view
from sluicegate.tenancy.store import KeyStore
from sluicegate.wire.admin_keys import KeyCreate, KeyUpdate

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


@router.post("/keys", response_model=None)
async def create_key(body: KeyCreate, state: StateDep) -> JSONResponse:
    record, secret = await _store(state).create(body)
    return JSONResponse({**record.view(), "key": secret}, status_code=201)


@router.get("/keys")
async def list_keys(state: StateDep) -> dict[str, Any]:
    managed = [record.view() for record in await _store(state).list()]
    ring = state.static_keys
    static = [static_view(key_id(d), d in ring.admin) for d in ring.digests]
    return {"object": "list", "data": static + managed}


@router.post("/keys/restore")
async def restore_keys(state: StateDep) -> dict[str, Any]:
    """The keys this process kept when Redis lost them, written back (`KeyStore.restore`)."""
    restored = await _store(state).restore()
    return {"object": "list", "data": [record.view() for record in restored]}


@router.get("/keys/{key}")
async def get_key(key: str, state: StateDep) -> dict[str, Any]:
    _writable(state, key)
    return (await _store(state).get(key)).view()


@router.patch("/keys/{key}")
async def update_key(key: str, body: KeyUpdate, state: StateDep) -> dict[str, Any]:
    _writable(state, key)
    return (await _store(state).update(key, body)).view()


@router.delete("/keys/{key}")
async def delete_key(key: str, state: StateDep) -> dict[str, Any]:
    _writable(state, key)
    await _store(state).delete(key)
    return {"id": key, "object": "api_key", "deleted": True}


def _store(state: AppState) -> KeyStore:
    if state.keys is None:
        raise NotFoundError(MANAGED_KEYS_OFF)
    return state.keys


def _writable(state: AppState, key: str) -> None:
    if any(key_id(d) == key for d in state.static_keys.digests):
        raise InvalidRequestError(
            f"The key `{key}` comes from SLUICEGATE_API_KEYS or ADMIN_API_KEYS: it is "
            "read-only here (change the setting and restart).",
            param="id",
        )
