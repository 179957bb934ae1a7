"""Fetching an image a client named by URL, under the address policy and the limits.

Each fetch has its own client and its own `_Guard`, which sits in the two places where
aiohttp decides where to connect: its resolver (a name is looked up once, and only the
addresses the policy takes are given back) and its socket factory (every socket's address is
checked again just before it connects, which is the only check a literal address gets from
aiohttp, which never resolves those). Redirects are followed here, one at a time, each URL
checked as the first was. No proxy from the environment; no compressed bodies (a small
gzip can inflate past any bound); the whole fetch, redirects included, under one deadline;
the body read only up to the byte bound, and only as long as its first bytes are an image's.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from sluicegate.engine.upstream.config import PoolConfig
from sluicegate.engine.upstream.transport import UpstreamTransport
from sluicegate.errors import MediaError
from sluicegate.media.formats import SNIFF_BYTES, ImageFormat, sniff
from sluicegate.media.policy import REASONS, Address, AddressPolicy, Refusal, parse_address

Lookup = Callable[[str, int], Awaitable[list[Address]]]
"""A name's addresses (the system's resolver; tests give their own)."""

HEADERS = {
    "Accept": "image/png, image/jpeg, image/gif, image/webp",
    "Accept-Encoding": "identity",
    "User-Agent": "sluicegate-media",
}


@dataclass(frozen=True, slots=True)
class FetchLimits:
    max_bytes: int = 10 * 1024 * 1024
    """Bytes an image may have."""
    timeout: float = 10.0
    """Seconds for a whole fetch: names, connections, redirects and the body."""
    max_redirects: int = 3


@dataclass(frozen=True, slots=True)
class Fetched:
    data: bytes
    format: ImageFormat
    url: str
    """Where it came from in the end (after redirects)."""
    redirects: int


LOOKUP_THREADS = 4
_lookups = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="media-dns")
"""The system resolver's calls for media, in threads of their own: a slow name server a
client chose holds these (a lookup cannot be cancelled), never the loop's default pool that
the upstreams' connections use."""


async def system_lookup(host: str, port: int) -> list[Address]:
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(
        _lookups, functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    )
    found: list[Address] = []
    for info in infos:
        address = parse_address(str(info[4][0]).split("%", 1)[0])
        if address is not None and address not in found:
            found.append(address)
    return found


NAME_REFUSED = "the image's host name resolves to no address the gateway fetches from"
"""The client's message for a name that does not resolve or resolves only to refused
addresses, alike: which one it was, and the addresses, would tell a client what the gateway's
network holds. The reason (a metric's label, the operator's) still tells them apart."""


def refused(kind: Refusal, address: str) -> MediaError:
    """The error for a literal address (the client's own) the policy refuses."""
    return MediaError(
        kind,
        f"the image's URL leads to {REASONS[kind]} ({address}), which the gateway does not "
        "fetch from",
    )


class _Guard(AbstractResolver):
    """One fetch's checks: aiohttp's resolver and socket factory (module docstring)."""

    def __init__(self, policy: AddressPolicy, lookup: Lookup) -> None:
        self.policy = policy
        self.lookup = lookup
        self.by_name: set[Address] = set()
        """Addresses of names the allow-list names (allowed whatever they are)."""
        self.refusal: MediaError | None = None
        """Why a connection was refused, when one was."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            addresses = await self.lookup(host, port)
        except (OSError, UnicodeError):  # a name the IDNA codec refuses is one too
            self.refusal = MediaError("unresolved", NAME_REFUSED)
            raise OSError(f"{host}: does not resolve") from None
        allowed_name = self.policy.allows_name(host)
        usable: list[Address] = []
        first_refused: Refusal | None = None
        for address in addresses:
            kind = None if allowed_name else self.policy.check(address)
            if kind is None:
                usable.append(address)
                if allowed_name:
                    self.by_name.add(address)
            elif first_refused is None:
                first_refused = kind
        if not usable:
            self.refusal = MediaError(first_refused or "unresolved", NAME_REFUSED)
            raise OSError(f"{host}: no address the media policy allows")
        return [
            {
                "hostname": host,
                "host": str(address),
                "port": port,
                "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in usable
        ]

    async def close(self) -> None:
        return None

    def socket(self, addr_info: Any) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        address = parse_address(str(sockaddr[0]).split("%", 1)[0])
        reason: Refusal | None = "reserved" if address is None else None
        if address is not None and address not in self.by_name:
            reason = self.policy.check(address)
        if reason is not None:
            # Reached only past the other checks; the address may be a name's: not shown.
            self.refusal = MediaError(reason, NAME_REFUSED)
            raise OSError(f"{sockaddr[0]}: refused by the media policy")
        return socket.socket(family=family, type=kind, proto=proto)


class _GuardedTransport(UpstreamTransport):
    """The upstreams' transport (its errors mapped as theirs), connecting through a guard."""

    def __init__(self, guard: _Guard, limits: FetchLimits, verify: ssl.SSLContext) -> None:
        self._guard = guard
        pool = PoolConfig(max_connections=1, max_keepalive=1, keepalive_expiry=limits.timeout)
        super().__init__(pool, verify=verify)

    def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=1,
            use_dns_cache=False,
            resolver=self._guard,
            socket_factory=self._guard.socket,
            ssl=self.ssl_context,
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,
        )


class Fetcher:
    """Fetches images by URL under one policy and one set of limits."""

    def __init__(
        self, policy: AddressPolicy, limits: FetchLimits, lookup: Lookup = system_lookup
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.lookup = lookup
        self._tls = httpx.create_ssl_context(trust_env=False)
        """Made once (tens of milliseconds each), verifying servers as httpx does."""

    async def fetch(self, url: str) -> Fetched:
        """The image at `url`; `MediaError` if the policy refuses where it leads, the server
        does not give an image within the limits, or the fetch takes too long."""
        try:
            async with asyncio.timeout(self.limits.timeout):
                return await self._fetch(url)
        except TimeoutError:
            raise MediaError(
                "timeout", f"fetching the image took longer than {self.limits.timeout:g} s"
            ) from None

    async def _fetch(self, url: str) -> Fetched:
        guard = _Guard(self.policy, self.lookup)
        transport = _GuardedTransport(guard, self.limits, self._tls)
        timeout = httpx.Timeout(self.limits.timeout)
        async with httpx.AsyncClient(
            transport=transport, timeout=timeout, trust_env=False, follow_redirects=False
        ) as client:
            for hop in range(self.limits.max_redirects + 1):
                target = self.checked(url)
                guard.refusal = None
                try:
                    async with client.stream("GET", target, headers=HEADERS) as response:
                        if response.is_redirect:
                            url = redirected(target, response.headers.get("location", ""))
                            continue
                        if response.status_code != 200:
                            raise MediaError(
                                "status",
                                f"the image's server answered {response.status_code}",
                            )
                        data, kind = await self._read(response)
                        return Fetched(data, kind, str(target), hop)
                except httpx.UnsupportedProtocol:  # aiohttp's refusal of a Location header
                    raise MediaError(
                        "bad_url", "the image's server redirected to an invalid URL"
                    ) from None
                except httpx.TransportError as exc:
                    if guard.refusal is not None:
                        raise guard.refusal from None
                    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                        raise MediaError(
                            "unreachable", "the image's server could not be reached"
                        ) from None
                    raise MediaError(
                        "bad_response", "the image's server broke off or answered in error"
                    ) from None
        raise MediaError(
            "redirects", f"the image's URL redirects more than {self.limits.max_redirects} times"
        )

    def checked(self, url: str) -> httpx.URL:
        """`url` parsed, if it is one the gateway may fetch: http or https, a host, and a
        literal address the policy takes (a name is checked when it is resolved)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            raise MediaError("bad_url", "the image's URL is not a valid URL") from None
        if parsed.scheme not in ("http", "https"):
            raise MediaError("bad_url", "an image's URL is http(s) or a data: URI")
        if not parsed.host:
            raise MediaError("bad_url", "the image's URL has no host")
        address = parse_address(parsed.host)
        if address is not None and (kind := self.policy.check(address)) is not None:
            raise refused(kind, str(address))
        return parsed

    async def _read(self, response: httpx.Response) -> tuple[bytes, ImageFormat]:
        bound = self.limits.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > bound:
            raise too_large(bound)
        data = bytearray()
        kind: ImageFormat | None = None
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) > bound:
                raise too_large(bound)
            if kind is None and len(data) >= SNIFF_BYTES:
                kind = sniff(bytes(data[:SNIFF_BYTES]))
                if kind is None:
                    raise not_an_image()
        if kind is None:
            kind = sniff(bytes(data))
            if kind is None:
                raise not_an_image()
        return bytes(data), kind


def redirected(target: httpx.URL, location: str) -> str:
    """Where a redirect from `target` leads (checked again, as a new URL, by the caller)."""
    try:
        return str(target.join(location))
    except httpx.InvalidURL:
        raise MediaError("bad_url", "the image's server redirected to an invalid URL") from None


def too_large(bound: int) -> MediaError:
    return MediaError("too_large", f"the image is larger than {bound} bytes")


def not_an_image() -> MediaError:
    return MediaError("not_an_image", "the image's bytes are not a PNG, JPEG, GIF or WebP image")
