"""Cache hits answered before routing: pure-ASGI middleware, innermost of the gateway's.

A request body whose shape `cache.fast_path` knows, and whose entry is in the store, is
answered here from the entry, rendered as the route would (`wire.events.render_cached`),
or from the body rendered for the same shape before (`ResponseCache.answer`).
Everything before this middleware still applies (request id, telemetry, API key, body
limits, admission); the rate limits are checked here. The body it reads is the one the body
limits already read, handed on as one message. Anything else (an unknown body, a miss, a
`no-cache` request, a store failure) goes on to the routes unchanged, with the body it read
handed on and its fingerprint noted for the route's cache lookup (`body_fingerprint`).
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.cache.fast_path import HitShape
from sluicegate.cache.near import NearEntry
from sluicegate.cache.response_cache import CacheControl, Lookup, ResponseCache
from sluicegate.errors import GatewayError
from sluicegate.http.asgi import api_key_id, caller_policy, header, read_body, replaying
from sluicegate.http.errors import send_error
from sluicegate.http.state import app_state
from sluicegate.keys import KeyPolicy
from sluicegate.models.registry import ModelRegistry
from sluicegate.observability.record import current_request, mark_model
from sluicegate.paths import CACHE_HIT_PATHS
from sluicegate.quota.quotas import ModelQuota, Quotas
from sluicegate.wire.body_template import encoded

_FINGERPRINT = "cache_fingerprint"


def body_fingerprint(scope: Scope) -> str | None:
    """The request body's fingerprint, when this middleware computed one."""
    state: dict[str, Any] = scope.get("state") or {}
    return state.get(_FINGERPRINT)


def cache_control(scope: Scope) -> CacheControl:
    value = header(scope["headers"], b"cache-control")
    return CacheControl.parse(None if value is None else value.decode("latin-1"))


class CacheHitMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = app_state(scope)
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in CACHE_HIT_PATHS
            or state is None
            or cache_control(scope).no_cache
        ):
            await self.app(scope, receive, send)
            return
        # `body_limits` has read the body whole: this is its one message, replayed.
        body = await read_body(receive)
        receive = replaying(body, receive)
        cache, key_id = state.cache, api_key_id(scope)
        fingerprint = cache.fast_path.fingerprint(scope["path"], body, key_id)
        shape = None if fingerprint is None else cache.fast_path.shape(fingerprint)
        model = None if shape is None else _serving(state.models, shape, caller_policy(scope))
        # Its model gone, or not the key's to use: the route answers (a 404).
        hit = None if shape is None or model is None else await cache.fetch(shape.key)
        if shape is None or model is None or hit is None or hit.entry is None:
            scope["state"][_FINGERPRINT] = fingerprint
            await self.app(scope, receive, send)
            return
        await _answer(scope, send, state.quotas, key_id, cache, shape, hit, hit.entry, model)


def _serving(models: ModelRegistry, shape: HitShape, policy: KeyPolicy | None) -> ModelQuota | None:
    """The limits of the model a remembered answer came from, if it still serves the same
    weights under its name; else None. A key limited to some models is left to the route:
    the shape knows the model that answered (a fallback, an alias's target), not the name
    the request gave, which is what the key's list is checked against."""
    if policy is not None and policy.models is not None:
        return None
    if not models.serves(shape.model, shape.identity):
        return None
    return models.resolve(shape.model).quota or ModelQuota(shape.model)


async def _answer(
    scope: Scope,
    send: Send,
    quotas: Quotas,
    key_id: str,
    cache: ResponseCache,
    shape: HitShape,
    hit: Lookup,
    entry: NearEntry,
    model: ModelQuota,
) -> None:
    completion = entry.completion
    mark_model(shape.model)
    try:
        # A cached answer's whole cost is known: charged up front, like the route's hits.
        quota_headers = await quotas.admit(
            key_id, shape.prompt_tokens, completion.completion_tokens, model
        )
    except GatewayError as exc:
        await send_error(send, exc, scope)
        return
    body, headers = cache.answer(entry, shape)
    # No name repeats between these: body, rate limits, budget, cache.
    headers += encoded(quota_headers)
    headers += shape.headers
    headers += ((b"x-cache", b"HIT"), (b"age", str(hit.age).encode()))
    if (record := current_request()) is not None:
        record.add_usage(
            completion.prompt_tokens, completion.completion_tokens, cached=completion.prompt_tokens
        )
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
