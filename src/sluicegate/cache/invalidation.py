"""Redis telling this process of every change to a cache key, so its near cache stays true.

Server-assisted client-side caching in broadcast mode, on one connection of its own (not one
of the pool's, so nothing else depends on its state): `CLIENT TRACKING ON BCAST PREFIX
<prefix>:cache:` redirected to itself, and `SUBSCRIBE __redis__:invalidate`. From then on
Redis publishes there the name of every key under the prefix that anyone writes, deletes,
or that expires or is evicted, and a null for a flush. RESP2 is enough, whatever protocol
the pool speaks.

The listener drives the near cache's gates (`cache.near`): it connects them once tracking is
on, pings every quarter of `max_lag` and moves `fresh_until` with each answer, and
disconnects them (a flush) when the connection fails or stays silent past `dead_after`,
then reconnects after `retry_interval`. A Redis that refuses tracking (before 6.0, or a
proxy in between) leaves the near cache off, with one warning.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError

from sluicegate.background import Background
from sluicegate.cache.near import NearCache
from sluicegate.observability.metrics import CACHE_NEAR_CONNECTED
from sluicegate.observability.throttled import ThrottledWarning

logger = logging.getLogger(__name__)

CHANNEL = "__redis__:invalidate"


class InvalidationListener:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        near: NearCache,
        prefix: str,
        max_lag: float,
        retry_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        pool = client.connection_pool
        self._new_connection: Callable[[], AbstractConnection] = lambda: pool.connection_class(
            **{**pool.connection_kwargs, "protocol": 2}
        )
        self._near = near
        self._prefix = prefix
        self._max_lag = max_lag
        self._every = max_lag / 4
        self._dead_after = 3 * max_lag
        self._retry = max(retry_interval, 0.1)
        self._clock = clock
        self._warning = ThrottledWarning(logger)
        self._listening = Background()

    def start(self) -> None:
        self._listening.start(self._run())

    async def close(self) -> None:
        await self._listening.stop()
        self._near.disconnect()

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except ResponseError as exc:
                logger.warning("redis refuses client tracking (%s): the near cache is off", exc)
                return
            except (TimeoutError, OSError, RedisError) as exc:
                self._warning.warn("cache invalidation connection lost (%s)", exc)
            await asyncio.sleep(self._retry)

    async def _listen(self) -> None:
        connection = self._new_connection()
        try:
            async with asyncio.timeout(self._dead_after):
                await connection.connect()  # type: ignore[no-untyped-call]
                client_id = await self._command(connection, "CLIENT", "ID")
                tracking = ("ON", "REDIRECT", client_id, "BCAST", "PREFIX", self._prefix)
                await self._command(connection, "CLIENT", "TRACKING", *tracking)
                subscribed = self._clock()
                await self._command(connection, "SUBSCRIBE", CHANNEL)
            # Every change from the SUBSCRIBE on is reported; the near cache was empty.
            self._near.connect(fresh_until=subscribed + self._max_lag)
            CACHE_NEAR_CONNECTED.set(1)
            logger.info("cache invalidations from redis: the near cache serves")
            await self._follow(connection)
        finally:
            self._near.disconnect()
            CACHE_NEAR_CONNECTED.set(0)
            await connection.disconnect()

    async def _follow(self, connection: AbstractConnection) -> None:
        """Apply reports and answer heartbeats until the connection fails or falls silent."""
        pings: collections.deque[float] = collections.deque()
        next_ping = self._clock()
        while True:
            now = self._clock()
            if now >= next_ping:
                pings.append(now)
                await connection.send_command("PING")
                next_ping = now + self._every
            message = await connection.read_response(timeout=max(next_ping - now, 0.001))
            if message is not None:
                self._apply(message, pings)
            elif pings and self._clock() - pings[0] > self._dead_after:
                raise TimeoutError(f"no answer from redis in {self._dead_after:.1f} s")

    def _apply(self, message: Any, pings: collections.deque[float]) -> None:
        kind = message[0]
        if kind == b"message":
            keys = message[2]
            if keys is None:
                self._near.flush()  # FLUSHDB, FLUSHALL
            else:
                self._near.invalidate(key.decode(errors="replace") for key in keys)
        elif kind == b"pong" and pings:
            self._near.fresh_until = pings.popleft() + self._max_lag

    @staticmethod
    async def _command(connection: AbstractConnection, *args: Any) -> Any:
        await connection.send_command(*args)
        return await connection.read_response()
