"""Redis: the one client the gateway keeps its state in, opened and greeted at start-up.

A client is a bounded pool of connections; `enter_redis` opens it for the lifespan, and
the subsystems below take it (or None: each then keeps its state in this process).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)


# A connection that does not come within this long is a failed operation (each user's own,
# shorter timeout usually ends the wait first); so is a socket that stops answering.
_REDIS_BACKSTOP_SECONDS = 1.0


def open_redis(settings: Settings) -> redis.asyncio.Redis | None:
    """One client (one bounded connection pool) for everything the gateway keeps in Redis."""
    if settings.redis_url is None:
        return None
    return redis_client(settings.redis_url.get_secret_value(), settings.redis_max_connections)


def redis_client(url: str, max_connections: int) -> redis.asyncio.Redis:
    """A client over a pool of at most `max_connections`, where an operation waits for a
    free connection rather than opening one more (BlockingConnectionPool).

    Each user bounds its own operations with a timeout; the socket timeout is a backstop.
    One retry lets a request ride over a connection that died with a Redis restart."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=_REDIS_BACKSTOP_SECONDS,
        socket_connect_timeout=_REDIS_BACKSTOP_SECONDS,
        socket_timeout=_REDIS_BACKSTOP_SECONDS,
        retry=Retry(NoBackoff(), 1),
    )
    return redis.asyncio.Redis.from_pool(pool)


async def greet_redis(client: redis.asyncio.Redis, wait: float = 2.0) -> None:
    """Open the first connection at start-up (TLS and AUTH included, which can take longer
    than one operation's timeout) and say whether Redis answers. Start-up goes on either way:
    the cache and rate limits fail open until Redis is back."""
    kwargs = client.connection_pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    try:
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        await Deadline(wait).run(client.ping())
    except (TimeoutError, OSError, RedisError) as exc:
        logger.warning("redis at %s does not answer (%s): serving without it", where, exc)
    else:
        logger.info("redis at %s answers", where)


async def enter_redis(settings: Settings, stack: AsyncExitStack) -> redis.asyncio.Redis | None:
    """`open_redis`'s client for the lifespan: closed when `stack` unwinds, and greeted."""
    client = open_redis(settings)
    if client is not None:
        stack.push_async_callback(client.aclose)
        await greet_redis(client)
    return client
