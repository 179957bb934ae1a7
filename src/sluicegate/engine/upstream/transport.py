"""The upstreams' HTTP transport: httpx's API over aiohttp's HTTP/1.1 client and its C parser.

`httpx-aiohttp`'s transport (the one the `openai` SDK ships) does the work; this subclass
only corrects what its errors mean. As shipped it maps every `aiohttp.ClientConnectionError`
that is not a connector error to `httpx.ConnectTimeout`: a reset mid-stream, a server that
closed the connection, or a broken pipe would read as a stall. Here each aiohttp error
becomes the httpx error of the same event, raised from the request and from the body's
stream alike, so the engine's retries, breakers and metrics see what happened.

What aiohttp does not honour of httpx's settings (docs/upstream.md#transport): the write
timeout, the number of idle connections kept (`max_keepalive_connections`: aiohttp keeps
every idle one until `keepalive_expiry`), HTTP/2 (`UPSTREAM_HTTP2=true` uses httpx's own
transport instead), retries of the connection and socket options.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from sluicegate.engine.upstream.config import PoolConfig

# The first class an error is an instance of decides, so the most specific come first.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    # Opening a connection, or waiting for one from the pool, took too long.
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    # The upstream sent nothing for the read timeout.
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientHttpProxyError, httpx.ProxyError),
    # Refused, unreachable, a name that does not resolve, a TLS handshake that failed.
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    # Closed before (or while) answering, a body cut short, an answer that is not HTTP.
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    # Reset by the peer, a broken pipe: the exchange failed on an open connection.
    (aiohttp.ClientConnectionError, httpx.ReadError),
    (aiohttp.ClientError, httpx.ReadError),
    (TimeoutError, httpx.ReadTimeout),
)
_CAUGHT = (httpx.TransportError, aiohttp.ClientError, TimeoutError)


def mapped_error(exc: BaseException) -> httpx.TransportError:
    """The httpx error for `exc`: an aiohttp error, or the httpx error the shipped transport
    made of one (its cause is the aiohttp error)."""
    original = exc.__cause__ if isinstance(exc, httpx.TransportError) else exc
    if original is None or not isinstance(original, (aiohttp.ClientError, TimeoutError)):
        if isinstance(exc, httpx.TransportError):
            return exc  # the transport's own (a URL it cannot send to)
        original = exc
    for source, target in _ERRORS:
        if isinstance(original, source):
            return target(str(original) or type(original).__name__)
    return httpx.ReadError(str(original) or type(original).__name__)


class _MappedStream(httpx.AsyncByteStream):
    """A response body whose errors are mapped as the request's are."""

    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except _CAUGHT as exc:
            raise mapped_error(exc) from exc

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        except _CAUGHT as exc:
            raise mapped_error(exc) from exc


class UpstreamTransport(AiohttpTransport):
    """`AiohttpTransport` with its errors mapped to the httpx errors they mean, its pool
    sized by the upstream's settings, and no cookie jar of aiohttp's own (httpx's client
    keeps cookies, as it does over its own transport)."""

    def __init__(self, pool: PoolConfig, verify: ssl.SSLContext | bool = True) -> None:
        # `verify`: a context made once and shared saves making one (~30 ms) per transport.
        super().__init__(
            verify=verify,
            trust_env=False,
            limits=limits(pool),
            client=self._session,
        )
        self._pool = pool

    def _session(self) -> aiohttp.ClientSession:
        # Made on the first request, inside the running event loop, as aiohttp requires.
        connector = aiohttp.TCPConnector(
            limit=self._pool.max_connections,
            keepalive_timeout=self._pool.keepalive_expiry,
            ssl=self.ssl_context,
        )
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except _CAUGHT as exc:
            raise mapped_error(exc) from exc
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _MappedStream(response.stream)
        return response


def upstream_transport(pool: PoolConfig) -> httpx.AsyncBaseTransport:
    """The transport for one upstream's client: aiohttp's, unless the pool asks for httpx's
    own (`UPSTREAM_TRANSPORT=httpcore`, or HTTP/2, which aiohttp does not speak), made as
    `httpx.AsyncClient` makes it from the same settings."""
    if pool.http2 or pool.transport == "httpcore":
        return httpx.AsyncHTTPTransport(http2=pool.http2, limits=limits(pool), trust_env=False)
    return UpstreamTransport(pool)


def limits(pool: PoolConfig) -> httpx.Limits:
    return httpx.Limits(
        max_connections=pool.max_connections,
        max_keepalive_connections=pool.max_keepalive,
        keepalive_expiry=pool.keepalive_expiry,
    )
