"""The API-key guard: requests without a valid bearer key get a 401 (pure ASGI).

Keys are parsed and matched in `keys` (the settings' keys, in constant time) and
`tenancy.store` (managed keys, by digest, in this process's copy: no call to Redis); this
module only reads the header and refuses. An expired managed key gets a 401 that says so. With
admin keys alone (no API keys), no request needs a key: a valid one is still read, so that
an admin key can call the admin endpoints (`http.admin_guard`). On the open paths a key is
read too when one is given, never refused: `/ready` shows its detail to the keys that may
read the metrics. The keys of scrapers (`METRICS_API_KEYS`) are known on the probe paths
alone: anywhere else they are no key."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import AuthenticationError
from sluicegate.http.asgi import header, set_caller
from sluicegate.http.errors import send_error
from sluicegate.http.state import app_state
from sluicegate.keys import ApiKeyring, Caller, digest_of, utc_time
from sluicegate.paths import PROBE_PATHS


class ApiKeyMiddleware:
    """Refuse requests without a valid bearer key, except on the open paths (exact) and
    under the open prefixes (static pages, whose API calls carry the key).

    Every refusal is the same 401, whether the header was absent, malformed or wrong. The key
    comes as `Authorization: Bearer <key>` or, as Anthropic's SDKs send it, `x-api-key`. The
    key's public id goes into the request state (`asgi.api_key_id`).
    """

    def __init__(
        self,
        app: ASGIApp,
        keyring: ApiKeyring,
        open_paths: frozenset[str],
        open_prefixes: tuple[str, ...] = (),
        required: bool = True,
        scrapers: ApiKeyring | None = None,
    ):
        """`required`: every request needs a valid key (API keys are set); else a key is only
        read, for the admin endpoints. `scrapers`: the keys that read the probe paths only."""
        self.app = app
        self.keyring = keyring
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.required = required
        self.scrapers = scrapers or ApiKeyring(())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self._is_open(path):
            if path in PROBE_PATHS:
                self._identify(scope, path)
            await self.app(scope, receive, send)
            return
        token = _bearer_token(scope)
        caller: Caller | None = None
        if token:  # no key given: whatever the rings hold, it is not a match
            try:
                caller = self._caller(scope, path, token)
            except AuthenticationError as exc:
                await send_error(send, exc, scope)
                return
        if caller is not None:
            set_caller(scope, caller)
        elif self.required:
            await send_error(
                send, AuthenticationError(headers={"www-authenticate": "Bearer"}), scope
            )
            return
        await self.app(scope, receive, send)

    def _identify(self, scope: Scope, path: str) -> None:
        """Note who calls an open probe path, if a valid key says so; refuse nothing."""
        token = _bearer_token(scope)
        if not token:
            return
        try:
            caller = self._caller(scope, path, token)
        except AuthenticationError:  # an expired key: no one, as no key is
            return
        if caller is not None:
            set_caller(scope, caller)

    def _caller(self, scope: Scope, path: str, token: str) -> Caller | None:
        """Who the key `token` is (on the probe paths, a scraper's key too), or None."""
        digest = digest_of(token)
        caller = self.keyring.match(digest) or _managed(scope, digest)
        if caller is None and path in PROBE_PATHS:
            scraper = self.scrapers.match(digest)
            if scraper is not None:
                caller = Caller(scraper.key_id, scraper=True)
        return caller

    def _is_open(self, path: str) -> bool:
        if path in self.open_paths:
            return True
        return any(path == p or path.startswith(p + "/") for p in self.open_prefixes)


def _managed(scope: Scope, digest: bytes) -> Caller | None:
    """The managed key with `digest` (`tenancy.store`), if there is one; an expired one is
    refused, saying so."""
    state = app_state(scope)
    store = None if state is None else state.keys
    record = None if store is None else store.find(digest)
    if store is None or record is None:
        return None
    if store.expired(record):
        raise AuthenticationError(
            f"This API key expired at {utc_time(record.settings['expires_at'])}.",
            headers={"www-authenticate": "Bearer"},
        )
    return Caller(record.id, policy=store.policy(record.id))


def _bearer_token(scope: Scope) -> str:
    """The key of `Authorization: Bearer <key>`, or of `x-api-key` (how Anthropic's SDKs send
    it) when there is no `Authorization`."""
    value = header(scope["headers"], b"authorization")
    if value is None:
        api_key = header(scope["headers"], b"x-api-key")
        return "" if api_key is None else api_key.decode("latin-1").strip()
    scheme, _, token = value.decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
