"""`Pool`'s health probes, over a fake upstream (httpx's mock transport): one late or failed
probe does not take a busy upstream out; `health_failures` in a row do, and one success puts
it back."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from sluicegate.engine.upstream.config import BreakerConfig, PoolConfig, UpstreamConfig
from sluicegate.engine.upstream.pool import Pool
from sluicegate.engine.upstream.server import Upstream


class FakeUpstreamHealth:
    """Answers each probe with the next status of `statuses` (0: the connection fails)."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        status = self.statuses.pop(0)
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, json={"data": []})


def _upstream(handler: Callable[[httpx.Request], httpx.Response]) -> Upstream:
    return Upstream(
        "http://10.0.0.1:8000/v1",
        1.0,
        PoolConfig(),
        BreakerConfig(),
        transport=httpx.MockTransport(handler),
    )


async def test_an_upstream_is_taken_out_after_failures_in_a_row_and_back_after_one_success() -> (
    None
):
    fake = FakeUpstreamHealth()
    upstream = _upstream(fake.handler)
    config = UpstreamConfig(urls=((upstream.url, 1.0),), health_failures=3)
    pool = Pool(config, [upstream])
    seen = []
    fake.statuses = [200, 503, 0, 200, 503, 0, 503, 503, 200]
    for _ in range(len(fake.statuses)):
        await pool.probe(upstream)
        seen.append(upstream.healthy)
    # A failure, another, then a success: never out. Then three failures in a row: out at the
    # third, still out at the fourth, back at the first success.
    assert seen == [True, True, True, True, True, True, False, False, True]
    await pool.check_health()
    await upstream.close()


async def test_a_good_probe_ends_a_503s_wait_but_not_a_429s() -> None:
    fake = FakeUpstreamHealth()
    upstream = _upstream(fake.handler)
    pool = Pool(UpstreamConfig(urls=((upstream.url, 1.0),)), [upstream])
    upstream.hold_off(60, rate_limited=False)  # a 503's Retry-After
    fake.statuses = [503]
    await pool.probe(upstream)
    assert not upstream.available()  # a failed probe tells nothing new
    fake.statuses = [200]
    await pool.probe(upstream)
    assert upstream.available()
    upstream.hold_off(60, rate_limited=True)  # a 429's: a rate limit, only time lifts it
    fake.statuses = [200]
    await pool.probe(upstream)
    assert not upstream.available()
    await upstream.close()


async def test_a_probe_sent_before_the_503_came_does_not_end_its_wait() -> None:
    upstream: Upstream

    def answer_after_a_503(request: httpx.Request) -> httpx.Response:
        upstream.hold_off(60, rate_limited=False)  # the 503 came while the probe was out
        return httpx.Response(200, json={"data": []})

    upstream = _upstream(answer_after_a_503)
    pool = Pool(UpstreamConfig(urls=((upstream.url, 1.0),)), [upstream])
    await pool.probe(upstream)
    assert not upstream.available()
    await upstream.close()
