"""One upstream server: its pooled client, breaker, health and load."""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import httpx

from sluicegate.engine.upstream.breaker import Breaker
from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig
from sluicegate.engine.upstream.transport import upstream_transport


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
        self.url = url.rstrip("/")
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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            http2=pool.http2,
            limits=httpx.Limits(
                max_connections=pool.max_connections,
                max_keepalive_connections=pool.max_keepalive,
                keepalive_expiry=pool.keepalive_expiry,
            ),
            timeout=httpx.Timeout(
                connect=pool.connect_timeout,
                read=pool.read_timeout,
                write=pool.write_timeout,
                pool=pool.pool_timeout,
            ),
            transport=transport or upstream_transport(pool),
            trust_env=False,
        )

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

    async def close(self) -> None:
        await self.client.aclose()


def _label(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
