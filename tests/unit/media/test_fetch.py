"""The fetcher against servers on loopback addresses: one the policy allows (127.0.0.2), and
a canary on one it does not (127.0.0.1), which must see no connection whatever the URL, the
redirects or the names lead to. Names resolve through a stand-in lookup (no DNS), to
loopback addresses only."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from sluicegate.errors import MediaError
from sluicegate.media import fetch
from sluicegate.media.fetch import Fetcher, FetchLimits
from sluicegate.media.policy import Address, AddressPolicy, parse_address
from tests.support.media_server import MediaServer, answer, drip, media_server, png, redirect

ALLOWED = "127.0.0.2"
CANARY = "127.0.0.1"
IMAGE = png()
LIMITS = FetchLimits(max_bytes=64 * 1024, timeout=5.0, max_redirects=3)


@pytest.fixture
async def canary() -> AsyncIterator[MediaServer]:
    async with media_server(CANARY, {"/cat.png": answer(IMAGE)}) as server:
        yield server


@pytest.fixture
async def allowed(canary: MediaServer) -> AsyncIterator[MediaServer]:
    routes = {
        "/cat.png": answer(IMAGE),
        "/chunked.png": answer(IMAGE, length=False),
        "/to-canary": redirect(canary.url("/cat.png")),
        "/to-cat": redirect("/cat.png", "301 Moved Permanently"),
        "/loop": redirect("/loop"),
        "/missing": answer(b"gone", "404 Not Found"),
        "/page": answer(b"<html><body>hello</body></html>"),  # says image/png
        "/big": answer(png(600, 600, (1, 2, 3, 4)) + b"\0" * LIMITS.max_bytes),
        "/big-chunked": answer(IMAGE + b"\0" * LIMITS.max_bytes, length=False),
        "/gzip": answer(gzip.compress(IMAGE), headers={"content-encoding": "gzip"}),
        "/drip": drip(0.2),
        "/to-nowhere": redirect("http://[::1"),
    }
    async with media_server(ALLOWED, routes) as server:
        yield server


class Names:
    """A stand-in for DNS: each name's answers, in turn (the last one kept)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[Address]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError("no such name")
        turns = self.answers[host]
        found = turns.pop(0) if len(turns) > 1 else turns[0]
        return [a for a in map(parse_address, found) if a is not None]


def _fetcher(allow: str = ALLOWED, names: Names | None = None, **limits: float) -> Fetcher:
    chosen = FetchLimits(**{**_fields(LIMITS), **limits})  # type: ignore[arg-type]
    return Fetcher(AddressPolicy.parse(allow), chosen, lookup=names or Names({}))


def _fields(limits: FetchLimits) -> dict[str, float]:
    return {
        "max_bytes": limits.max_bytes,
        "timeout": limits.timeout,
        "max_redirects": limits.max_redirects,
    }


async def _refusal(fetcher: Fetcher, url: str) -> MediaError:
    with pytest.raises(MediaError) as caught:
        await fetcher.fetch(url)
    return caught.value


async def test_an_allowed_address_serves_its_image(allowed: MediaServer) -> None:
    fetched = await _fetcher().fetch(allowed.url("/cat.png"))
    assert (fetched.data, fetched.format, fetched.redirects) == (IMAGE, "png", 0)
    chunked = await _fetcher().fetch(allowed.url("/chunked.png"))
    assert chunked.data == IMAGE


async def test_an_address_outside_the_allow_list_is_never_connected_to(
    canary: MediaServer,
) -> None:
    refused = await _refusal(_fetcher(), canary.url("/cat.png"))
    assert refused.reason == "loopback"
    assert refused.status_code == 400 and refused.code == "invalid_image"
    assert "loopback" in refused.message and "127.0.0.1" in refused.message
    assert canary.connections == 0


async def test_every_redirect_is_checked_again(allowed: MediaServer, canary: MediaServer) -> None:
    refused = await _refusal(_fetcher(), allowed.url("/to-canary"))
    assert refused.reason == "loopback"
    assert canary.connections == 0
    followed = await _fetcher().fetch(allowed.url("/to-cat"))
    assert (followed.data, followed.redirects) == (IMAGE, 1)
    assert followed.url == allowed.url("/cat.png")
    looped = await _refusal(_fetcher(), allowed.url("/loop"))
    assert looped.reason == "redirects"
    assert allowed.requests.count("/loop") == LIMITS.max_redirects + 1


async def test_a_name_that_resolves_to_a_refused_address_is_refused(
    allowed: MediaServer, canary: MediaServer
) -> None:
    names = Names({"images.test": [[CANARY]], "mixed.test": [[CANARY, ALLOWED]]})
    refused = await _refusal(_fetcher(names=names), f"http://images.test:{canary.port}/cat.png")
    assert refused.reason == "loopback"
    # The client learns neither the address nor its kind: the gateway's network is its own.
    assert "127.0.0.1" not in refused.message and "loopback" not in refused.message
    # A name with a refused and an allowed address is connected to at the allowed one only.
    fetched = await _fetcher(names=names).fetch(f"http://mixed.test:{allowed.port}/cat.png")
    assert fetched.data == IMAGE
    assert canary.connections == 0
    unknown = await _refusal(_fetcher(names=names), "http://nowhere.test/cat.png")
    assert unknown.reason == "unresolved"
    assert unknown.message == refused.message  # a name that resolves inside, or none: alike


async def test_a_name_on_the_allow_list_may_resolve_to_an_inner_address(
    canary: MediaServer,
) -> None:
    names = Names({"images.internal": [[CANARY]]})
    fetcher = _fetcher(allow="images.internal", names=names)
    fetched = await fetcher.fetch(f"http://images.internal:{canary.port}/cat.png")
    assert fetched.data == IMAGE
    assert canary.connections == 1
    # The name allows what it resolves to only when reached by that name.
    assert (await _refusal(fetcher, canary.url("/cat.png"))).reason == "loopback"
    assert canary.connections == 1


async def test_the_address_checked_is_the_address_connected_to(
    allowed: MediaServer, canary: MediaServer
) -> None:
    """DNS rebinding: the name answers an allowed address once, a refused one after."""
    names = Names({"rebind.test": [[ALLOWED], [CANARY]]})
    fetcher = _fetcher(names=names)
    first = await fetcher.fetch(f"http://rebind.test:{allowed.port}/cat.png")
    assert first.data == IMAGE
    assert names.asked == ["rebind.test"]  # looked up once, connected where the answer said
    second = await _refusal(fetcher, f"http://rebind.test:{canary.port}/cat.png")
    assert second.reason == "loopback"
    assert canary.connections == 0


async def test_a_body_past_the_bound_is_refused_declared_or_not(allowed: MediaServer) -> None:
    for path in ("/big", "/big-chunked"):
        refused = await _refusal(_fetcher(), allowed.url(path))
        assert refused.reason == "too_large", path
        assert str(LIMITS.max_bytes) in refused.message


async def test_what_is_not_an_image_is_refused_whatever_its_content_type(
    allowed: MediaServer,
) -> None:
    assert (await _refusal(_fetcher(), allowed.url("/page"))).reason == "not_an_image"
    # A compressed body is not inflated (a small one can inflate past any bound).
    assert (await _refusal(_fetcher(), allowed.url("/gzip"))).reason == "not_an_image"
    missing = await _refusal(_fetcher(), allowed.url("/missing"))
    assert (missing.reason, missing.message) == ("status", "the image's server answered 404")


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.2/cat.png", "file:///etc/passwd", "http:///cat.png", "gopher://x/"]
)
async def test_only_http_urls_with_a_host_are_fetched(url: str) -> None:
    assert (await _refusal(_fetcher(), url)).reason == "bad_url"


async def test_a_slow_drip_ends_at_the_fetch_timeout_and_the_loop_stays_free(
    allowed: MediaServer,
) -> None:
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        refused = await _refusal(_fetcher(timeout=1.0), allowed.url("/drip"))
    finally:
        ticker.cancel()
    assert refused.reason == "timeout"
    assert "1 s" in refused.message
    # No stall a user would see: the loop ran its other work all along.
    assert max(gaps) < 0.5


async def test_the_socket_factory_alone_keeps_a_literal_address_out(
    canary: MediaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the URL's own check gone (a literal address never reaches the resolver), the
    check of each socket's address still refuses it."""
    monkeypatch.setattr(Fetcher, "checked", lambda self, url: httpx.URL(url))
    refused = await _refusal(_fetcher(), canary.url("/cat.png"))
    assert refused.reason == "loopback"
    assert canary.connections == 0


async def test_the_socket_factory_alone_keeps_a_resolved_address_out(
    canary: MediaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the resolver's filter gone (every address handed on), the socket factory still
    refuses the one the name resolved to."""

    async def unfiltered(self: fetch._Guard, host: str, port: int = 0, family: int = 0) -> list:
        return [
            {"hostname": host, "host": str(a), "port": port, "family": 2, "proto": 0, "flags": 4}
            for a in await self.lookup(host, port)
        ]

    monkeypatch.setattr(fetch._Guard, "resolve", unfiltered)
    names = Names({"images.test": [[CANARY]]})
    refused = await _refusal(_fetcher(names=names), f"http://images.test:{canary.port}/cat.png")
    assert refused.reason == "loopback"
    assert canary.connections == 0


async def test_the_resolver_alone_keeps_a_resolved_address_out(
    canary: MediaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        fetch._Guard, "socket", lambda self, info: __import__("socket").socket(*info[:3])
    )
    names = Names({"images.test": [[CANARY]]})
    refused = await _refusal(_fetcher(names=names), f"http://images.test:{canary.port}/cat.png")
    assert refused.reason == "loopback"
    assert canary.connections == 0


async def test_a_name_the_codec_refuses_and_a_broken_redirect_are_400s(
    allowed: MediaServer,
) -> None:
    # An empty label fails in the IDNA codec, before any lookup is sent.
    unresolved = await _refusal(Fetcher(AddressPolicy(), LIMITS), "http://a..b/cat.png")
    assert unresolved.reason == "unresolved"
    broken = await _refusal(_fetcher(), allowed.url("/to-nowhere"))
    assert broken.reason == "bad_response"


async def test_the_system_lookup_runs_in_its_own_bounded_threads() -> None:
    found = await fetch.system_lookup("127.0.0.2", 80)
    assert [str(a) for a in found] == ["127.0.0.2"]
    assert fetch._lookups._max_workers == fetch.LOOKUP_THREADS
