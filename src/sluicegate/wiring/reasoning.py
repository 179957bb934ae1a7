"""The reasoning seal's keys: the configured one, else one shared through Redis, else one
made at start for this gateway's workers (`wire.reasoning_seal`)."""

from __future__ import annotations

import logging
import secrets

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.settings import Settings
from sluicegate.wire.reasoning_seal import MIN_KEY_BYTES, ReasoningSeal

logger = logging.getLogger(__name__)

REDIS_KEY_SUFFIX = "reasoning-key"
"""Under `REDIS_KEY_PREFIX`: the key every replica signs with when none is configured."""
_REDIS_WAIT = 2.0


async def open_reasoning_seal(
    settings: Settings, client: redis.asyncio.Redis | None, made: bytes | None = None
) -> ReasoningSeal:
    """The seal for this process. `made`: a key made at start by the supervisor for all its
    workers (one process makes its own), used when neither `REASONING_KEY` nor Redis gives
    one."""
    earlier = settings.earlier_reasoning_keys()
    configured = settings.configured_reasoning_key()
    if configured is not None:
        return ReasoningSeal((configured, *earlier))
    made = made or secrets.token_bytes(MIN_KEY_BYTES)
    if client is not None:
        shared = await _shared_key(client, f"{settings.redis_key_prefix}:{REDIS_KEY_SUFFIX}", made)
        if shared is not None:
            return ReasoningSeal((shared, *earlier))
    logger.warning(
        "no REASONING_KEY%s: thinking signatures and sealed reasoning last as long as this "
        "gateway (set SLUICEGATE_REASONING_KEY so that they survive a restart)",
        "" if client is None else " and Redis did not answer",
    )
    return ReasoningSeal((made, *earlier))


def workers_key(settings: Settings) -> bytes:
    """The key a supervisor hands its workers (`Worker.reasoning_key`): with Redis and no
    configured key, the one shared there, read once for all of them, so that a worker whose
    own read fails at start still signs as its siblings do; else one made here."""
    made = secrets.token_bytes(MIN_KEY_BYTES)
    if settings.reasoning_key is not None or settings.redis_url is None:
        return made
    import redis

    name = f"{settings.redis_key_prefix}:{REDIS_KEY_SUFFIX}"
    client = redis.Redis.from_url(
        settings.redis_url.get_secret_value(),
        socket_timeout=_REDIS_WAIT,
        socket_connect_timeout=_REDIS_WAIT,
    )
    try:
        client.set(name, made, nx=True)
        stored = client.get(name)
    except (OSError, redis.RedisError) as exc:
        logger.warning("redis did not give the shared reasoning key (%s)", exc.__class__.__name__)
        return made
    finally:
        client.close()
    return stored if isinstance(stored, bytes) and len(stored) >= MIN_KEY_BYTES else made


async def _shared_key(client: redis.asyncio.Redis, name: str, candidate: bytes) -> bytes | None:
    """The key every replica shares: `candidate` if this replica is the first to set it, else
    the one already there; None when Redis does not answer."""
    try:
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        await Deadline(_REDIS_WAIT).run(client.set(name, candidate, nx=True))
        stored = await Deadline(_REDIS_WAIT).run(client.get(name))
    except (TimeoutError, OSError, RedisError) as exc:
        logger.warning("redis did not give the shared reasoning key (%s)", exc.__class__.__name__)
        return None
    if not isinstance(stored, bytes) or len(stored) < MIN_KEY_BYTES:
        logger.warning("the shared reasoning key in redis is not one this gateway made")
        return None
    return stored
