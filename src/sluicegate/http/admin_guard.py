"""The guard of the admin endpoints (`/admin/*`, loading and unloading LoRA adapters), as pure
ASGI: everything that can refuse such a call is checked before its body is read.

FastAPI reads and parses a route's JSON body before the route's dependencies run, so a guard
in a dependency let anyone send megabytes to be parsed on the event loop before the 403. Here,
in request order, before a byte of the body:

1. a route whose feature is off answers 404 (managed keys, the usage ledger, adapters loaded
   at run time, admission bounds changed at run time), as if it did not exist;
2. with keys, a caller without a key gets a 401, and one whose key is not an admin's a 403;
3. the call is counted against its key's admin limit (`Quotas.enter_admin`): 429 past it.

What is let through then meets `http.body_limits` with the admin endpoints' own, small cap
(`ADMIN_MAX_REQUEST_BYTES`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import (
    AuthenticationError,
    GatewayError,
    NotFoundError,
    PermissionDeniedError,
)
from sluicegate.http.asgi import api_key_id, is_admin
from sluicegate.http.errors import send_error
from sluicegate.http.state import Access, AppState, app_state
from sluicegate.keys import ANONYMOUS
from sluicegate.paths import ADMIN_PREFIX, LORA_PATHS, is_admin_path, route_path

MANAGED_KEYS_OFF = "Managed keys are off (SLUICEGATE_MANAGED_KEYS)."
USAGE_LEDGER_OFF = "The usage ledger is off (it needs SLUICEGATE_REDIS_URL)."
RUNTIME_LORA_OFF = "Loading LoRA adapters at run time is off (SLUICEGATE_ALLOW_RUNTIME_LORA)."
RUNTIME_ADMISSION_OFF = (
    "Changing the admission bounds at run time is off (SLUICEGATE_ALLOW_RUNTIME_ADMISSION)."
)


class AdminGuardMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = app_state(scope) if scope["type"] == "http" else None
        if state is None or not is_admin_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            _check_feature(scope["path"], state)
            refusal = admin_refusal(scope, state.access)
            if refusal is not None:
                raise refusal
            await state.quotas.enter_admin(api_key_id(scope))
        except GatewayError as exc:
            await send_error(send, exc, scope)
            return
        await self.app(scope, receive, send)


def admin_refusal(scope: Scope, access: Access) -> GatewayError | None:
    """Why the request may not call an admin endpoint, or None if it may: open without keys;
    with keys, admin keys only (401 without a valid key, 403 with a key that is not an
    admin's)."""
    if not access.admin_guarded or is_admin(scope):
        return None
    if api_key_id(scope) == ANONYMOUS:
        return AuthenticationError(headers={"www-authenticate": "Bearer"})
    return PermissionDeniedError("Only admin keys (SLUICEGATE_ADMIN_API_KEYS) may call this.")


def _check_feature(path: str, state: AppState) -> None:
    """A 404 for an admin endpoint whose feature is off."""
    path = route_path(path)
    if path in LORA_PATHS:
        if not state.allow_runtime_lora:
            raise NotFoundError(RUNTIME_LORA_OFF)
    elif _under(path, ADMIN_PREFIX + "/keys"):
        if state.keys is None:
            raise NotFoundError(MANAGED_KEYS_OFF)
    elif _under(path, ADMIN_PREFIX + "/usage") and state.usage is None:
        raise NotFoundError(USAGE_LEDGER_OFF)
    elif _under(path, ADMIN_PREFIX + "/admission") and not state.allow_runtime_admission:
        raise NotFoundError(RUNTIME_ADMISSION_OFF)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")
