"""`wiring.reasoning`: the reasoning seal's key is the configured one, else one shared by every
replica through Redis, else the one the supervisor made for its workers; earlier keys still
verify. Against a real Redis."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio

from sluicegate import wiring
from sluicegate.settings import Settings
from sluicegate.wire.reasoning_seal import MIN_KEY_BYTES, ReasoningSeal
from tests.support.redis_server import shared_redis_url

KEY = "c" * MIN_KEY_BYTES
EARLIER = "e" * MIN_KEY_BYTES
MADE = b"m" * MIN_KEY_BYTES


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def test_the_configured_key_signs_and_earlier_keys_still_verify() -> None:
    seal = await wiring.reasoning.open_reasoning_seal(
        settings(reasoning_key=KEY, reasoning_previous_keys=EARLIER), None, MADE
    )
    assert ReasoningSeal([KEY.encode()]).verify("t", seal.sign("t"))
    assert seal.verify("t", ReasoningSeal([EARLIER.encode()]).sign("t"))
    assert not seal.verify("t", ReasoningSeal([MADE]).sign("t"))


async def test_without_a_key_or_redis_the_workers_share_the_made_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="sluicegate.wiring.reasoning"):
        first = await wiring.reasoning.open_reasoning_seal(settings(), None, MADE)
        second = await wiring.reasoning.open_reasoning_seal(settings(), None, MADE)
    assert second.verify("t", first.sign("t"))
    assert "REASONING_KEY" in caplog.text
    # One process alone makes its own, which no other knows.
    alone = await wiring.reasoning.open_reasoning_seal(settings(), None)
    assert not alone.verify("t", first.sign("t"))


async def test_replicas_share_one_key_through_redis(prefix: str) -> None:
    config = settings(redis_url=shared_redis_url(), redis_key_prefix=prefix)
    seals = []
    for made in (b"a" * MIN_KEY_BYTES, b"b" * MIN_KEY_BYTES):  # two replicas, two made keys
        client = redis.asyncio.Redis.from_url(shared_redis_url())
        try:
            seals.append(await wiring.reasoning.open_reasoning_seal(config, client, made))
        finally:
            await client.aclose()
    assert seals[1].verify("t", seals[0].sign("t"))
    assert seals[0].open(seals[1].seal("t")) == "t"
    assert seals[0].verify("t", ReasoningSeal([b"a" * MIN_KEY_BYTES]).sign("t"))


async def test_redis_down_falls_back_to_the_made_key(caplog: pytest.LogCaptureFixture) -> None:
    client = wiring.redis_client("redis://127.0.0.1:1/0", 2)
    try:
        with caplog.at_level(logging.WARNING, logger="sluicegate.wiring.reasoning"):
            seal = await wiring.reasoning.open_reasoning_seal(settings(), client, MADE)
    finally:
        await client.aclose()
    assert seal.verify("t", ReasoningSeal([MADE]).sign("t"))
    assert "did not answer" in caplog.text


def test_a_supervisor_reads_the_shared_key_once_for_its_workers(prefix: str) -> None:
    """Its workers fall back to it when their own read of Redis fails: they sign alike."""
    config = settings(redis_url=shared_redis_url(), redis_key_prefix=prefix)
    first = wiring.reasoning.workers_key(config)
    assert wiring.reasoning.workers_key(config) == first  # the one in Redis, not a new one
    assert wiring.reasoning.workers_key(settings(reasoning_key=KEY)) != first
    down = settings(redis_url="redis://127.0.0.1:1/0", redis_key_prefix=prefix)
    assert len(wiring.reasoning.workers_key(down)) == MIN_KEY_BYTES


async def test_a_worker_whose_read_fails_signs_as_its_siblings(prefix: str) -> None:
    config = settings(redis_url=shared_redis_url(), redis_key_prefix=prefix)
    handed = wiring.reasoning.workers_key(config)
    client = redis.asyncio.Redis.from_url(shared_redis_url())
    try:
        sibling = await wiring.reasoning.open_reasoning_seal(config, client, handed)
    finally:
        await client.aclose()
    down = wiring.redis_client("redis://127.0.0.1:1/0", 2)
    try:
        alone = await wiring.reasoning.open_reasoning_seal(config, down, handed)
    finally:
        await down.aclose()
    assert alone.verify("t", sibling.sign("t"))
