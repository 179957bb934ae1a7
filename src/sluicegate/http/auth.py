"""The API-key guard: requests without a valid bearer key get a 401 (pure ASGI).

Keys are parsed and matched in `keys`; this module only reads the header and refuses."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import AuthenticationError
from sluicegate.http.asgi import header, set_api_key_id
from sluicegate.http.errors import send_error
from sluicegate.keys import ApiKeyring


class ApiKeyMiddleware:
    """Refuse requests without a valid bearer key, except on the open paths (exact) and
    under the open prefixes (static pages, whose API calls carry the key).

    Every refusal is the same 401, whether the header was absent, malformed or wrong. The
    key's public id goes into the request state (`asgi.api_key_id`).
    """

    def __init__(
        self,
        app: ASGIApp,
        keyring: ApiKeyring,
        open_paths: frozenset[str],
        open_prefixes: tuple[str, ...] = (),
    ):
        self.app = app
        self.keyring = keyring
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        key = self.keyring.identify(_bearer_token(scope))
        if key is None:
            await send_error(send, AuthenticationError(headers={"www-authenticate": "Bearer"}))
            return
        set_api_key_id(scope, key)
        await self.app(scope, receive, send)

    def _is_open(self, path: str) -> bool:
        if path in self.open_paths:
            return True
        return any(path == p or path.startswith(p + "/") for p in self.open_prefixes)


def _bearer_token(scope: Scope) -> str:
    value = header(scope["headers"], b"authorization")
    if value is None:
        return ""
    scheme, _, token = value.decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
