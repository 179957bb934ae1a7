"""Typed access to what the lifespan opened, as FastAPI `Annotated` dependencies.

Every dependency is `async def`, even though none awaits: FastAPI runs plain `def`
dependencies in its thread pool, a thread hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.errors import EngineUnavailableError
from sluicegate.http.asgi import api_key_id
from sluicegate.http.state import AppState, app_state


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
