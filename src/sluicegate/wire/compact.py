"""A request body validated and made compact, for large bodies parsed in a worker process.

Parsing and validating a body of megabytes holds the GIL for as long as it takes (json and
pydantic-core are C and Rust that never let go of it), which would stall the event loop. So
`api.route.LargeBodyRoute` sends large bodies here, in another process, and gets back either
the first validation error or the request as plain data with each message's content parts
joined into one text (what `ChatMessage.text()` would give), which the route then validates
again cheaply: what it costs depends on the number of messages, not of parts.

A request that runs as another API's (`wire.messages.Converted`: Anthropic's Messages) is
converted here as well, when the route can hand the endpoint the request as it is
(`convert`): it comes back as the request itself, its turns converted already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from sluicegate.wire.messages import Converted
from sluicegate.wire.requests import ChatMessage


@dataclass(frozen=True, slots=True)
class CompactBody:
    data: dict[str, Any] | None
    """The validated request as JSON data, content parts joined; None when invalid."""
    errors: list[dict[str, Any]]
    """The first validation error, located as FastAPI locates them (`("body", ...)`)."""
    request: BaseModel | None = None
    """The request converted already (`convert`), for the endpoint as it is; then no `data`."""


def compact_body(model: type[BaseModel], body: bytes, convert: bool = False) -> CompactBody:
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        ctx = first.get("ctx") or {}
        error = {
            "type": first["type"],
            "loc": ("body", *first["loc"]),
            "msg": first["msg"],
            "ctx": {k: str(v) for k, v in ctx.items()},
        }
        return CompactBody(None, [error])
    if convert and isinstance(request, Converted):
        return CompactBody(None, [], request.converted())
    data = request.model_dump(mode="json", exclude_unset=True, by_alias=True)
    messages = getattr(request, "messages", None)  # chat completions, /tokenize
    if isinstance(messages, list) and "messages" in data:
        for message, parsed in zip(data["messages"], messages, strict=True):
            if (
                isinstance(parsed, ChatMessage)
                and isinstance(parsed.content, list)
                and not parsed.has_images()
            ):
                message["content"] = parsed.text()
    return CompactBody(data, [])
