"""Cross-origin requests from browsers: Starlette's CORS middleware, configured once.

It sits outermost (see `app.middleware`), so a preflight is answered before the API key is
asked for, and every response, a 401 or a 429 from the middleware below included, carries the
headers a page needs to read it.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from sluicegate.inference.budget import BUDGET_HEADERS

EXPOSED_HEADERS = (
    "X-Request-Id",
    "X-Cache",
    "Age",
    "Retry-After",
    "x-sluicegate-fallback",
    "x-sluicegate-overhead-duration-ms",
    *BUDGET_HEADERS,
    *(
        f"x-ratelimit-{what}-{unit}"
        for what in ("limit", "remaining", "reset")
        for unit in ("requests", "tokens")
    ),
)
"""Response headers a page's script may read (beyond the CORS-safelisted ones)."""
PREFLIGHT_MAX_AGE_S = 600


def cors_middleware(origins: list[str]) -> Middleware:
    return Middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
        # Any request header: SDKs add their own (the openai JS SDK sends `x-stainless-*`).
        # No credentials (cookies) are allowed, so this exposes nothing a page could not send.
        allow_headers=["*"],
        expose_headers=list(EXPOSED_HEADERS),
        allow_credentials=False,
        max_age=PREFLIGHT_MAX_AGE_S,
    )
