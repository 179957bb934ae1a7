"""`coalesced`: an upstream body read in a task, handed on as one piece per wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from sluicegate.engine.upstream.reads import coalesced


async def burst(count: int) -> AsyncGenerator[bytes, None]:
    """`count` chunks with no wait between them (one socket read's worth), then one later."""
    for i in range(count):
        yield b"%d," % i
    await asyncio.sleep(0.01)
    yield b"end"


async def test_chunks_that_came_together_are_one_piece_and_nothing_is_lost() -> None:
    pieces = [p async for p in coalesced(burst(32))]
    assert b"".join(pieces) == b"".join(b"%d," % i for i in range(32)) + b"end"
    assert len(pieces) <= 3


async def test_a_consumer_that_keeps_up_gets_each_chunk_as_it_comes() -> None:
    async def slow() -> AsyncGenerator[bytes, None]:
        for i in range(5):
            await asyncio.sleep(0.005)
            yield b"%d" % i

    pieces = [p async for p in coalesced(slow())]
    assert pieces == [b"0", b"1", b"2", b"3", b"4"]


async def test_the_source_error_comes_after_the_bytes_before_it() -> None:
    async def failing() -> AsyncGenerator[bytes, None]:
        yield b"a"
        yield b"b"
        raise ConnectionResetError("gone")

    got = []
    with pytest.raises(ConnectionResetError):
        async for piece in coalesced(failing()):
            got.append(piece)
    assert b"".join(got) == b"ab"


async def test_closing_early_stops_the_reading() -> None:
    stopped = asyncio.Event()

    async def endless() -> AsyncGenerator[bytes, None]:
        try:
            while True:
                await asyncio.sleep(0.001)
                yield b"x"
        finally:
            stopped.set()

    pieces = coalesced(endless())
    assert await anext(pieces)
    await pieces.aclose()
    await asyncio.wait_for(stopped.wait(), 1)


async def test_the_last_piece_and_the_end_together_do_not_hang() -> None:
    # The source ends while the consumer is busy with the last piece: the end must still be
    # seen (no wait for a wake-up that already came).
    async def two() -> AsyncGenerator[bytes, None]:
        yield b"a"
        yield b"b"

    async def consume() -> list[bytes]:
        got = []
        async for piece in coalesced(two()):
            got.append(piece)
            await asyncio.sleep(0.01)
        return got

    assert b"".join(await asyncio.wait_for(consume(), 2)) == b"ab"


async def test_the_reading_waits_while_its_limit_is_held_and_loses_nothing() -> None:
    pulled = 0

    async def endless() -> AsyncGenerator[bytes, None]:
        nonlocal pulled
        while True:
            pulled += 1
            yield b"%09d," % pulled
            await asyncio.sleep(0)

    pieces = coalesced(endless(), limit=100)  # ten chunks of 10 bytes
    got = [await anext(pieces)]
    for _ in range(3):
        await asyncio.sleep(0.02)  # a slow consumer: an unbounded reader reads on
        before = pulled
        await asyncio.sleep(0.02)
        assert pulled == before  # back-pressure: stopped, not dropping
        piece = await anext(pieces)
        assert 100 <= len(piece) <= 100 + 10  # the limit, and the chunk that reached it
        got.append(piece)
    await pieces.aclose()
    numbers = [int(n) for n in b"".join(got).split(b",") if n]
    assert numbers == list(range(1, len(numbers) + 1))
