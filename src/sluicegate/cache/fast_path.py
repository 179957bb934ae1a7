"""Cache hits answered before routing: pure-ASGI middleware, innermost of the gateway's.

A request body that once went the whole way (validation, tokenization, token budget, cache
lookup) leaves behind its `HitShape`, noted by `ResponseCache.lookup`: the cache key it maps
to, the prompt tokens it is charged, its budget headers and how it is rendered. When an
identical body (same JSON up to key order and whitespace, same path, same key namespace)
comes again and its entry is in the store, this middleware answers from the entry directly.
Everything before it still applies: request id, telemetry, API key, admission, body limits;
the rate limits are checked here. Anything else (an unknown body, a miss, a `no-cache`
request, a store failure) goes on to the routes unchanged, with the body it read handed on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.cache.response_cache import CacheControl, HitShape, ResponseCache
from sluicegate.errors import GatewayError
from sluicegate.middleware import send_error
from sluicegate.observability.record import current_request
from sluicegate.paths import INFERENCE_PATHS
from sluicegate.quota import ANONYMOUS, Quotas
from sluicegate.responses import Completion, chat_format, completion_format
from sluicegate.service import replay_events
from sluicegate.streaming import SSE_DONE, SSE_HEADERS

FINGERPRINT = "cache_fingerprint"
"""Where the body's fingerprint goes in the request state, for the route's cache lookup."""


class CacheHitMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: dict[str, Any] = scope.get("state") or {}
        cache: ResponseCache | None = state.get("cache")
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in INFERENCE_PATHS
            or cache is None
            or _cache_control(scope).no_cache
        ):
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(receive)
        except Exception as exc:  # a body limit's error: the routes render it
            await self.app(scope, _raising(exc), send)
            return
        receive = _replaying(body, receive)
        key_id: str = state.get("api_key_id", ANONYMOUS)
        fingerprint = cache.fingerprint(scope["path"], body, key_id)
        shape = None if fingerprint is None else cache.shape(fingerprint)
        hit = None if shape is None else await cache.fetch(shape.key)
        if shape is None or hit is None or hit.completion is None:
            state[FINGERPRINT] = fingerprint
            await self.app(scope, receive, send)
            return
        await _answer(
            send, state["quotas"], key_id, cache.model_name, shape, hit.completion, hit.headers()
        )


async def _answer(
    send: Send,
    quotas: Quotas,
    key_id: str,
    model: str,
    shape: HitShape,
    completion: Completion,
    hit_headers: dict[str, str],
) -> None:
    try:
        quota_headers = await quotas.admit(key_id, shape.prompt_tokens)
    except GatewayError as exc:
        await send_error(send, exc)
        return
    new_format = chat_format if shape.chat else completion_format
    fmt = new_format(model, shape.include_usage)
    if shape.stream:
        body = replay_events(fmt, completion, shape.include_usage) + SSE_DONE
        headers: dict[str, str] = {"content-type": "text/event-stream", **SSE_HEADERS}
    else:
        content = fmt.response(completion)
        body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "content-length": str(len(body))}
    headers.update(quota_headers)
    headers.update(shape.headers)
    headers.update(hit_headers)
    if (record := current_request()) is not None:
        record.add_usage(completion.prompt_tokens, completion.completion_tokens)
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    await send({"type": "http.response.body", "body": body})
    await quotas.settle(key_id, completion.completion_tokens)


def _cache_control(scope: Scope) -> CacheControl:
    for name, value in scope["headers"]:
        if name == b"cache-control":
            return CacheControl.parse(value.decode("latin-1"))
    return CacheControl()


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for the routes: the body already read, then the connection's own messages."""
    pending: Mapping[str, Any] | None = {"type": "http.request", "body": body, "more_body": False}

    async def replay() -> Message:
        nonlocal pending
        if pending is not None:
            message, pending = pending, None
            return dict(message)
        return await receive()

    return replay


def _raising(exc: Exception) -> Receive:
    async def receive() -> Message:
        raise exc

    return receive
