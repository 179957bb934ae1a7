"""One upstream server: its pooled client, breaker, health and load."""

from __future__ import annotations

import base64
import time
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from sluicegate.engine.upstream.breaker import Breaker
from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig
from sluicegate.engine.upstream.transport import UpstreamTransport, upstream_transport


class Upstream:
    def __init__(
        self,
        url: str,
        weight: float,
        pool: PoolConfig,
        breaker: BreakerConfig,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, credentials = _credentials(url.rstrip("/"))
        """The base URL, without credentials (sent as basic auth instead)."""
        self.weight = weight
        self.label = _label(self.url)
        """The URL without credentials: the `upstream` label of metrics and logs."""
        self.breaker = Breaker(breaker)
        self.healthy = True
        """What the health probes said (an upstream starts trusted)."""
        self.failed_probes = 0
        """Health probes failed in a row."""
        self.in_flight = 0
        self.models: dict[str, str | None] = {}
        """What its `/v1/models` listed last: each model id with its `parent` (an adapter's
        base model, as vLLM's server lists them), refreshed with the health probes."""
        self.not_before = 0.0
        """Monotonic time before which it asked not to be sent requests (Retry-After)."""
        self._held_since = 0.0
        self._rate_limited = False
        self._endpoints: dict[str, httpx.URL] = {}
        headers = {}
        if credentials is not None:
            # As httpx would send a URL's own: basic auth, in place of the API key.
            headers["Authorization"] = f"Basic {credentials}"
        elif api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._transport = transport or upstream_transport(pool)
        self.reads_whole = isinstance(self._transport, UpstreamTransport)
        """Whether a read of an answer's body hands out all that has come since the last
        (aiohttp's, up to 16 KiB, its buffer bounded by its own flow control), rather than
        one HTTP chunk at a time (httpcore's: the engine reads ahead, `reads.coalesced`)."""
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(
                connect=pool.connect_timeout,
                read=pool.read_timeout,
                write=pool.write_timeout,
                pool=pool.pool_timeout,
            ),
            transport=self._transport,
            trust_env=False,
        )
        self._json_headers = httpx.Headers(self.client.headers)
        self._json_headers["Content-Type"] = "application/json"
        self._extensions = {"timeout": self.client.timeout.as_dict()}

    async def send(self, path: str, content: bytes) -> httpx.Response:
        """POST the JSON `content` to `path` under the base URL, straight to the pool's
        transport: the answer, its headers read and its body not (`aiter_bytes`, then
        `aclose`). The same request the client would send (its headers, its timeouts),
        without what `AsyncClient.send` does around the transport, which these requests
        have no use for and which costs about 0.1 ms each (an auth flow, redirects, event
        hooks, and a cookie jar, which here would carry one client's upstream cookies to
        every other)."""
        request = httpx.Request(
            "POST",
            self.endpoint(path),
            content=content,
            headers=self._json_headers,
            extensions=self._extensions,
        )
        return await self._transport.handle_async_request(request)

    def endpoint(self, path: str) -> httpx.URL:
        """The absolute URL of `path` under the base URL, parsed once: httpx would otherwise
        parse and join the two strings on every request."""
        url = self._endpoints.get(path)
        if url is None:
            url = self._endpoints[path] = httpx.URL(self.url + path)
        return url

    def origin(self) -> str:
        """The scheme and host, for paths outside /v1 (`/health`, `/tokenize`)."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))

    def hold_off(self, seconds: float, rate_limited: bool) -> None:
        """Keep it out of the pick for `seconds`, as its `Retry-After` asked (already
        clamped). A 429's wait is a rate limit, which only time lifts; a 503's says it
        cannot serve now, which a later health probe answers afresh (`probe_answered`)."""
        now = time.monotonic()
        self.not_before = now + seconds
        self._held_since = now
        self._rate_limited = rate_limited

    def probe_answered(self, sent_at: float) -> None:
        """A health probe sent at `sent_at` was answered 200: a 503's wait that began
        before it is over (a rate limit's is not)."""
        if not self._rate_limited and self._held_since < sent_at:
            self.not_before = 0.0

    def available(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.healthy and now >= self.not_before and self.breaker.available()

    def wait(self, now: float) -> float | None:
        """Seconds from `now` until it may be sent a request again (its `Retry-After`, its
        breaker), or None while it is unhealthy: only a health probe can tell."""
        if not self.healthy:
            return None
        return max(self.not_before - now, self.breaker.wait(), 0.0)

    async def close(self) -> None:
        await self.client.aclose()


def _credentials(url: str) -> tuple[str, str | None]:
    """`url` without its user and password, and them as basic auth's token (None without)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    userinfo = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    token = base64.b64encode(userinfo.encode()).decode()
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), token


def _label(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
