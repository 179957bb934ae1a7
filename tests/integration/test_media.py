"""The media policy on a running gateway: images named by URL are fetched by the gateway under
its policy and bounds, and reach the upstream inline; what the policy refuses is never
connected to.

The gateway fronts `tests.support.fault_upstream` (no engine of its own: its start loads none)
as two models, `seer` (reads images) and `blind` (`images: false`). Image servers run in the
test's own loop (`tests.support.media_server`): the allowed one on 127.0.0.2
(`MEDIA_ALLOWED_HOSTS`), a canary on 127.0.0.1, which the policy refuses as loopback: it counts
the connections that reach it, and must count none. Every URL here is on loopback: metadata,
private and link-local addresses are refused by the policy's unit tests, never by a running
gateway (a bug would send traffic off the machine).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import running as running_upstream
from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.loop_probe import (
    lag_buckets,
    longest_silence,
    probe_while_sending,
    samples_over,
)
from tests.support.media_server import MediaServer, answer, drip, media_server, png, redirect
from tests.support.metrics import metric_value

ALLOWED = "127.0.0.2"
CANARY = "127.0.0.1"
MAX_BYTES = 64 * 1024
MAX_PIXELS = 100 * 100
FETCH_TIMEOUT = 1.0
RED = png(8, 8, (200, 40, 40))
BYPASS = {"cache-control": "no-cache, no-store"}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    with running_upstream(tmp_path_factory.mktemp("seer") / "upstream.log") as process:
        yield process


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("gateway")
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: seer
    upstreams: [{{url: "{upstream.url}"}}]
  - name: blind
    upstreams: [{{url: "{upstream.url}"}}]
    images: false
"""
    )
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_UPSTREAM_MAX_RETRIES": "0",
        "SLUICEGATE_MEDIA_ALLOWED_HOSTS": ALLOWED,
        "SLUICEGATE_MEDIA_MAX_BYTES": str(MAX_BYTES),
        "SLUICEGATE_MEDIA_MAX_PIXELS": str(MAX_PIXELS),
        "SLUICEGATE_MEDIA_MAX_IMAGES": "2",
        "SLUICEGATE_MEDIA_FETCH_TIMEOUT": str(FETCH_TIMEOUT),
    }
    with running_gateway(folder, env=env) as process:
        yield process


@pytest.fixture(scope="module")
def roomy(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> Iterator[GatewayProcess]:
    """The same upstream behind a gateway with the media settings' defaults."""
    folder = tmp_path_factory.mktemp("roomy")
    models = folder / "models.yaml"
    models.write_text(f'models:\n  - name: seer\n    upstreams: [{{url: "{upstream.url}"}}]\n')
    env = {"SLUICEGATE_MODELS_FILE": str(models), "SLUICEGATE_UPSTREAM_MAX_RETRIES": "0"}
    with running_gateway(folder, env=env) as process:
        yield process


@pytest.fixture
async def allowed() -> AsyncIterator[MediaServer]:
    routes = {
        "/red.png": answer(RED),
        "/big.png": answer(RED + b"\0" * MAX_BYTES),
        "/wide.png": answer(png(200, 200)),
        "/text.png": answer(b"<html>not an image</html>"),
        "/drip.png": drip(0.2),
    }
    async with media_server(ALLOWED, routes) as server:
        yield server


@pytest.fixture
async def canary() -> AsyncIterator[MediaServer]:
    async with media_server(CANARY, {"/red.png": answer(RED)}) as server:
        yield server


def chat(*urls: str, model: str = "seer") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}


async def post(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(gateway.url + "/v1/chat/completions", json=body, headers=BYPASS)


def refused(response: httpx.Response, param: str = "messages.0.content.1") -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["param"] == param
    assert param in error["message"], error
    return error


def last_images(upstream: FaultUpstreamProcess) -> list[str]:
    """The image URLs of the last chat body the upstream got."""
    body = upstream.stats()["bodies"][-1]
    return [
        part["image_url"]["url"]
        for message in body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


async def test_an_allowed_url_reaches_the_upstream_inline(
    gateway: GatewayProcess, upstream: FaultUpstreamProcess, allowed: MediaServer
) -> None:
    inline = "data:image/png;base64," + base64.b64encode(RED).decode()
    response = await post(gateway, chat(allowed.url("/red.png"), inline))
    assert response.status_code == 200, response.text
    assert allowed.requests == ["/red.png"]
    sent = last_images(upstream)
    assert sent == [inline, inline]  # the fetched bytes, inline: never the client's URL
    assert metric_value(gateway.url, "sluicegate_media_fetches_total", outcome="ok") >= 1


async def test_loopback_is_never_connected_to_by_address_name_or_redirect(
    gateway: GatewayProcess, allowed: MediaServer, canary: MediaServer
) -> None:
    before = metric_value(gateway.url, "sluicegate_media_refusals_total", reason="loopback")
    allowed.routes["/away"] = redirect(canary.url("/red.png"))
    by_name = f"http://localhost:{canary.port}/red.png"
    for url in (canary.url("/red.png"), by_name, allowed.url("/away")):
        refused(await post(gateway, chat(url)))
    assert canary.connections == 0
    after = metric_value(gateway.url, "sluicegate_media_refusals_total", reason="loopback")
    assert after - before == 3


@pytest.mark.parametrize(
    ("path", "reason"),
    [("/big.png", "too_large"), ("/wide.png", "too_many_pixels"), ("/text.png", "not_an_image")],
)
async def test_images_past_a_bound_or_not_images_are_refused(
    gateway: GatewayProcess, allowed: MediaServer, path: str, reason: str
) -> None:
    before = metric_value(gateway.url, "sluicegate_media_refusals_total", reason=reason)
    error = refused(await post(gateway, chat(allowed.url(path))))
    assert error["code"] == "invalid_image"
    after = metric_value(gateway.url, "sluicegate_media_refusals_total", reason=reason)
    assert after == before + 1


async def test_a_slow_drip_ends_at_the_fetch_timeout_and_the_gateway_stays_responsive(
    gateway: GatewayProcess, allowed: MediaServer
) -> None:
    fetch = asyncio.ensure_future(post(gateway, chat(allowed.url("/drip.png"))))
    slowest = 0.0
    async with httpx.AsyncClient(timeout=10) as client:
        while not fetch.done():
            started = time.perf_counter()
            assert (await client.get(gateway.url + "/health")).status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(0.05)
    refused(await fetch)
    # A stall a user would see: the probe is on loopback, the drip holds nothing else.
    assert slowest < 1.0


async def test_too_many_images_are_refused_before_any_fetch(
    gateway: GatewayProcess, allowed: MediaServer
) -> None:
    url = allowed.url("/red.png")
    response = await post(gateway, chat(url, url, url))
    assert response.status_code == 400, response.text
    assert "3 images" in response.json()["error"]["message"]
    assert allowed.connections == 0


async def test_a_text_only_model_refuses_images_without_fetching(
    gateway: GatewayProcess, allowed: MediaServer
) -> None:
    response = await post(gateway, chat(allowed.url("/red.png"), model="blind"))
    refused(response)
    assert "takes text only" in response.json()["error"]["message"]
    assert allowed.connections == 0


def test_health_keeps_answering_while_a_bodys_images_are_read(
    roomy: GatewayProcess, upstream: FaultUpstreamProcess, tmp_path: Path
) -> None:
    """The most a body may hold of images (8 of a million noisy pixels each, inline, just
    under the 8 MiB body limit): base64 decoded, hashed, decoded and sent on inline, all off
    the event loop. Probed as `test_loop_lag` probes its hostile bodies: `/health` from a
    process of its own, never two seconds without an answer; no loop-lag sample past 2.5 s."""
    from tests.integration.test_loop_lag import BODY_LIMIT, STALL_BOUND_S, STALL_BUCKET

    urls = [
        "data:image/jpeg;base64," + base64.b64encode(noise(1000, seed)).decode()
        for seed in range(8)
    ]
    payload = json.dumps(chat(*urls)).encode()
    assert BODY_LIMIT * 3 / 4 < len(payload) <= BODY_LIMIT
    body = tmp_path / "body.json"
    body.write_bytes(payload)
    lag_before = lag_buckets(roomy.url)
    probed = probe_while_sending(roomy.url, "/v1/chat/completions", body, tmp_path)
    status, answer = probed.status, probed.answer
    assert status == "200", answer
    assert len(last_images(upstream)) == 8
    silence = longest_silence(probed.probes, probed.began, probed.ended)
    assert silence <= STALL_BOUND_S, f"/health went {silence * 1000:.0f} ms without an answer"
    assert samples_over(lag_before, lag_buckets(roomy.url), STALL_BUCKET) == 0


def noise(side: int, seed: int) -> bytes:
    """A JPEG of random pixels (it compresses little: about 0.7 MB at 1000 x 1000)."""
    from PIL import Image

    pixels = random.Random(seed).randbytes(side * side * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(buffer, "JPEG", quality=80)
    return buffer.getvalue()
