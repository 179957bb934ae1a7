"""Typed access to what the lifespan opened, as FastAPI `Annotated` dependencies.

Every dependency is `async def`, even though none awaits: FastAPI runs plain `def`
dependencies in its thread pool, a thread hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.errors import AuthenticationError, EngineUnavailableError, PermissionDeniedError
from sluicegate.http.asgi import api_key_id, caller_policy, is_admin
from sluicegate.http.state import AppState, app_state
from sluicegate.keys import ANONYMOUS
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


def models_for(request: Request, state: AppState) -> PermittedModels:
    """The models the caller's key may use (every model, but for a managed key limited to
    some)."""
    return PermittedModels(state.models, caller_policy(request.scope))


async def get_models(request: Request, state: StateDep) -> PermittedModels:
    return models_for(request, state)


ModelsDep = Annotated[PermittedModels, Depends(get_models)]


async def require_admin(request: Request, state: StateDep) -> None:
    """The admin endpoints: open without keys; with keys, admin keys only (401 without a
    valid key, 403 with a key that is not an admin's)."""
    if not state.access.admin_guarded or is_admin(request.scope):
        return
    if api_key_id(request.scope) == ANONYMOUS:
        raise AuthenticationError(headers={"www-authenticate": "Bearer"})
    raise PermissionDeniedError("Only admin keys (SLUICEGATE_ADMIN_API_KEYS) may call this.")


AdminDep = Depends(require_admin)
"""For a route's `dependencies`: admin keys only."""
