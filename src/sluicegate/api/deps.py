"""Typed access to what the lifespan opened, as FastAPI `Annotated` dependencies.

Every dependency is `async def`, even though none awaits: FastAPI runs plain `def`
dependencies in its thread pool, a thread hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.errors import EngineUnavailableError
from sluicegate.http.admin_guard import admin_refusal
from sluicegate.http.asgi import api_key_id, caller_policy
from sluicegate.http.state import AppState, app_state
from sluicegate.models.permitted import PermittedModels


async def get_state(request: Request) -> AppState:
    state = app_state(request.scope)
    if state is None:  # only outside the lifespan, which serves no request
        raise EngineUnavailableError()
    return state


async def get_key_id(request: Request) -> str:
    """The caller's public key id, or `anonymous` when the gateway has no API keys."""
    return api_key_id(request.scope)


StateDep = Annotated[AppState, Depends(get_state)]
KeyIdDep = Annotated[str, Depends(get_key_id)]


async def count_request(request: Request, state: StateDep) -> None:
    """Count a request that runs no engine work against its key's requests per minute, as
    every request is (`Quotas.enter`): 429 past them."""
    await state.quotas.enter(api_key_id(request.scope), engine_work=False)


CountedDep = Depends(count_request)
"""For a route's `dependencies`: counted against the key's requests per minute."""


def models_for(request: Request, state: AppState) -> PermittedModels:
    """The models the caller's key may use (every model, but for a managed key limited to
    some)."""
    return PermittedModels(state.models, caller_policy(request.scope))


async def get_models(request: Request, state: StateDep) -> PermittedModels:
    return models_for(request, state)


ModelsDep = Annotated[PermittedModels, Depends(get_models)]


async def require_admin(request: Request, state: StateDep) -> None:
    """The admin endpoints: open without keys; with keys, admin keys only. `http.admin_guard`
    refuses the others before their body is read; this holds for a route it does not see."""
    refusal = admin_refusal(request.scope, state.access)
    if refusal is not None:
        raise refusal


AdminDep = Depends(require_admin)
"""For a route's `dependencies`: admin keys only."""
