"""The usage ledger's writes and reads alone, against a real Redis: batches, a batch sent
twice, days and months, and the write that cannot land."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import redis.asyncio

from sluicegate.prices import Price
from sluicegate.tenancy.ledger import UsageLedger, _Batch
from sluicegate.tenancy.usage import UsageQuery, UsageReader
from tests.support.metrics import local_value
from tests.support.redis_server import running_redis, shared_redis_url

DEC_31 = 1798761600.0 - 3600  # 2026-12-31T23:00:00Z
JAN_1 = DEC_31 + 7200  # 2027-01-01T01:00:00Z


def _query(**extra: object) -> UsageQuery:
    fields = {"start": date(2026, 12, 1), "end": date(2027, 1, 31), **extra}
    return UsageQuery(**fields)  # type: ignore[arg-type]


async def test_a_batch_sent_twice_is_counted_once_and_read_back_by_day_and_month(
    prefix: str,
) -> None:
    client = redis.asyncio.Redis.from_url(shared_redis_url())
    now = [DEC_31]
    ledger = UsageLedger(
        client, prefix, price_of=lambda m: Price(1.0, 2.0) if m == "m1" else None,
        clock=lambda: now[0],
    )  # fmt: skip
    ledger.record("key-a", "m1", 10, 5, cached=4, error=False)
    ledger.record("key-a", "m2", 3, 0, cached=0, error=True)
    now[0] = JAN_1
    ledger.record("key-b", "m1", 1, 1, cached=0, error=False)
    batch = _Batch("fixed-id", dict(ledger._pending))
    await ledger._send(batch)
    await ledger._send(batch)  # a reply lost, the batch sent again
    reader = UsageReader(client, prefix)
    by_day = await reader.read(_query())
    assert [(r["period"], r["key_id"], r["model"]) for r in by_day["data"]] == [
        ("2026-12-31", "key-a", "m1"),
        ("2026-12-31", "key-a", "m2"),
        ("2027-01-01", "key-b", "m1"),
    ]
    totals = by_day["totals"]
    assert totals["requests"] == 3 and totals["input_tokens"] == 14
    assert totals["output_tokens"] == 6 and totals["cached_input_tokens"] == 4
    assert totals["errors"] == 1
    # m1: (10 + 1) input at 1 per million, (5 + 1) output at 2 per million.
    assert totals["cost"] == (11 * 1 + 6 * 2) / 1e6
    by_month = await reader.read(_query(group_by="month", key_id="key-a", model="m1"))
    assert [(r["period"], r["requests"]) for r in by_month["data"]] == [("2026-12", 1)]
    await client.aclose()


async def test_a_write_that_cannot_land_is_retried_then_counted_lost(prefix: str) -> None:
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens
    # The first flush fails well within `give_up_after`, on a loaded machine too.
    ledger = UsageLedger(client, prefix, give_up_after=2.0, op_timeout=0.2)
    lost = local_value("sluicegate_usage_lost_total", measure="output_tokens")
    ledger.record("key-a", "m1", 10, 7, cached=0, error=False)
    assert not await ledger.flush()  # kept, to be sent again
    assert local_value("sluicegate_usage_lost_total", measure="output_tokens") == lost
    await asyncio.sleep(2.1)
    assert not await ledger.flush()
    assert local_value("sluicegate_usage_lost_total", measure="output_tokens") == lost + 7
    assert await ledger.flush()  # nothing left
    await client.aclose()


async def test_a_price_given_after_a_models_first_request_is_counted_from_then_on(
    prefix: str,
) -> None:
    """The ledger once remembered a model without a price as such for good."""
    client = redis.asyncio.Redis.from_url(shared_redis_url())
    prices: dict[str, Price] = {}
    ledger = UsageLedger(client, prefix, price_of=prices.get, clock=lambda: DEC_31)
    ledger.record("key-a", "late", 1_000_000, 0, cached=0, error=False)
    prices["late"] = Price(1.0, 0.0)  # an adapter a pool lists later, say
    ledger.record("key-a", "late", 1_000_000, 0, cached=0, error=False)
    assert await ledger.flush()
    totals = (await UsageReader(client, prefix).read(_query()))["totals"]
    assert totals["input_tokens"] == 2_000_000 and totals["cost"] == 1.0
    await client.aclose()


async def test_a_short_pause_of_redis_costs_the_ledger_and_its_reader_no_connection(
    tmp_path: Path, prefix: str
) -> None:
    """Redis asleep past a write's or a read's own timeout (0.1 s) but within the pool's
    socket timeout (1 s): each fails (the write is kept for the next flush, the read answers
    503), and the pooled connection is waited for rather than torn down."""
    from sluicegate.errors import StoreUnavailableError
    from sluicegate.wiring import redis_client

    with running_redis(tmp_path) as server:
        client = redis_client(server.url, max_connections=1)
        ledger = UsageLedger(client, prefix, op_timeout=0.1, clock=lambda: DEC_31)
        ledger.record("key-a", "m1", 10, 5, cached=0, error=False)

        async def flush() -> None:
            assert not await ledger.flush()  # failed: kept

        raised, kept = await server.across_a_pause(client, flush, pause=0.5)
        assert raised is None
        assert kept, "the ledger's write tore the pooled connection down"
        assert await ledger.flush()  # the batch lands on the same connection
        reader = UsageReader(client, prefix, op_timeout=0.1)
        raised, kept = await server.across_a_pause(client, lambda: reader.read(_query()), pause=0.5)
        assert isinstance(raised, StoreUnavailableError)
        assert kept, "the usage reader tore the pooled connection down"
        assert (await reader.read(_query()))["totals"]["requests"] == 1
        await client.aclose()
