"""Small helpers on ASGI scopes and request bodies, shared by the middleware and routes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from starlette.types import Message, Receive, Scope

from sluicegate.keys import ANONYMOUS, Caller, KeyPolicy

_API_KEY_ID = "api_key_id"
_ADMIN = "api_key_admin"
_READS_METRICS = "api_key_reads_metrics"
_POLICY = "api_key_policy"
_COUNTED = "request_counted"
BODY_RECEIVED = "sluicegate.body_received"
"""The scope extension `http.connection` sets when a request's whole body had arrived
before the app began: reading it then cannot wait, and needs no timer."""
OVER_CONNECTION_LIMIT = "sluicegate.over_connection_limit"
"""The scope extension `http.connection` sets on a request whose connection is past
`MAX_CONNECTIONS`: `http.admission` refuses it."""


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower case, as ASGI servers and Starlette give
    names) in a scope's or a response's `headers`, or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


def api_key_id(scope: Scope) -> str:
    """The caller's public key id (set by `http.auth`), or `anonymous` without API keys."""
    state: dict[str, Any] = scope.get("state") or {}
    return state.get(_API_KEY_ID, ANONYMOUS)  # type: ignore[no-any-return]


def set_caller(scope: Scope, caller: Caller) -> None:
    state = scope.setdefault("state", {})
    state[_API_KEY_ID] = caller.key_id
    state[_ADMIN] = caller.admin
    state[_READS_METRICS] = caller.reads_metrics
    if caller.policy is not None:
        state[_POLICY] = caller.policy


def caller_policy(scope: Scope) -> KeyPolicy | None:
    """A managed key's settings (set by `http.auth`), or None for any other caller."""
    state: dict[str, Any] = scope.get("state") or {}
    return state.get(_POLICY)


def is_admin(scope: Scope) -> bool:
    """Whether the request's key is an admin key (`SLUICEGATE_ADMIN_API_KEYS`)."""
    state: dict[str, Any] = scope.get("state") or {}
    return bool(state.get(_ADMIN, False))


def reads_metrics(scope: Scope) -> bool:
    """Whether the request's key is an admin's or a scraper's (`METRICS_API_KEYS`)."""
    state: dict[str, Any] = scope.get("state") or {}
    return bool(state.get(_READS_METRICS, False))


def mark_counted(scope: Scope) -> None:
    """The request has been counted against its key's requests per minute
    (`Quotas.enter`): admitting it later counts its tokens only."""
    scope.setdefault("state", {})[_COUNTED] = True


def counted(scope: Scope) -> bool:
    state: dict[str, Any] = scope.get("state") or {}
    return bool(state.get(_COUNTED, False))


def body_received(scope: Scope) -> bool:
    """Whether the whole body was already at hand when the app began (`BODY_RECEIVED`)."""
    extensions = scope.get("extensions")
    return extensions is not None and BODY_RECEIVED in extensions


def over_connection_limit(scope: Scope) -> bool:
    """Whether the request came on a connection past the limit (`OVER_CONNECTION_LIMIT`)."""
    extensions = scope.get("extensions")
    return extensions is not None and OVER_CONNECTION_LIMIT in extensions


async def read_body(receive: Receive) -> bytes:
    """The whole request body (what arrived before a disconnect, if the client left)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app below: the body already read, then the connection's messages."""
    pending: Mapping[str, Any] | None = {"type": "http.request", "body": body, "more_body": False}

    async def replay() -> Message:
        nonlocal pending
        if pending is not None:
            message, pending = pending, None
            return dict(message)
        return await receive()

    return replay
