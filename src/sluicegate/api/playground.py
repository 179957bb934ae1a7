"""`GET /playground`: a page that streams completions, from files shipped in the package.

Starlette's `StaticFiles` serves them (off the event loop, with ETags); there is no build step
and nothing is fetched from a CDN. The page calls the API like any other client, with the key
typed into it.

Every file it serves carries a strict policy (`HEADERS`): the page runs only its
own files, talks only to this origin, cannot be framed (a page that holds a typed key must
not be clickjacked), and no file is sniffed into another type. The page has no inline script
or style, so none needs a nonce; `tests/browser/test_playground.py` checks that the browser
reports no violation while the page works.
"""

from __future__ import annotations

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.paths import PLAYGROUND_PATH

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers older than CSP 2
    (b"referrer-policy", b"no-referrer"),
)


def playground_mount() -> Mount:
    files = StaticFiles(packages=[("sluicegate", "playground")], html=True)
    return Mount(PLAYGROUND_PATH, app=_Guarded(files), name="playground")


class _Guarded:
    """The playground's files, each with `HEADERS` (pure ASGI). A path that is not one is
    the API's JSON 404, rendered outside the mount."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self._app(scope, receive, guarded)
