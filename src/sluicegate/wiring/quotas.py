"""Quotas and budgets: rate limits, each key's share of the engines, and the budgets.

Rate limits and budgets live in Redis when there is one (shared by replicas), else in
this process; `enter_quotas` opens them for the lifespan.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.observability.key_label import KeyLabels
from sluicegate.quota.budgets import BudgetKeeper
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.quotas import Quotas, no_policies
from sluicegate.quota.redis_limiter import RedisRateLimiter
from sluicegate.quota.share import KeyShare, SequenceShare
from sluicegate.quota.window import RateLimit, RateLimiter
from sluicegate.settings import Settings
from sluicegate.tenancy.store import KeyStore
from sluicegate.wire.embeddings import MAX_INPUTS
from sluicegate.wiring.redis import greet_redis, redis_client
from sluicegate.worker import Worker

logger = logging.getLogger(__name__)


def default_rate_limit(settings: Settings) -> RateLimit:
    return RateLimit(settings.rate_limit_requests_per_minute, settings.rate_limit_tokens_per_minute)


def rate_limit_overrides(settings: Settings) -> dict[str, RateLimit]:
    return {
        key: RateLimit(o.requests_per_minute, o.tokens_per_minute)
        for key, o in settings.rate_limit_overrides.items()
    }


def sequence_share(settings: Settings, worker: Worker | None = None) -> SequenceShare:
    """Each API key's share of the engine's sequences: half of them unless set, and no
    bound without API keys (every request is then the same anonymous key). Counted where
    every worker counts (`worker.tally`)."""
    per_key = settings.max_sequences_per_key
    if not settings.keyed:
        per_key = None
    elif per_key is None:
        per_key = max(1, settings.max_num_seqs // 2)
    return SequenceShare(
        per_key=per_key,
        prioritize=settings.scheduling_policy == "priority",
        priorities=dict(settings.key_priorities),
        keyed=settings.keyed,
        tally=(worker or Worker()).tally,
    )


def embedding_share(settings: Settings, worker: Worker | None = None) -> KeyShare:
    """Each API key's share of the embedding engine, in inputs: 4096 (two requests of the
    most inputs) unless set, and no bound without API keys."""
    per_key = settings.max_embedding_inputs_per_key
    if not settings.keyed:
        per_key = None
    elif per_key is None:
        per_key = 2 * MAX_INPUTS
    return KeyShare(per_key=per_key, tally=(worker or Worker()).tally)


async def open_quotas(
    settings: Settings,
    client: redis.asyncio.Redis | None,
    worker: Worker | None = None,
    keys: KeyStore | None = None,
    labels: KeyLabels | None = None,
) -> Quotas:
    """Rate limits in Redis when there is one (shared by replicas), else in this process;
    with managed `keys`, their own limits, priorities and budgets (kept beside the limits).

    `RATE_LIMIT_REDIS_URL` gives them a Redis of their own (closed with the limiter);
    either way, the Redis they use is checked for an eviction policy that could drop them.
    Of N workers, each enforces 1/N of what a process enforces in its own memory."""
    worker = worker or Worker()
    budgets = None
    limiter: RateLimiter
    own = settings.rate_limit_redis_url
    if own is not None:
        client = redis_client(own.get_secret_value(), settings.redis_max_connections)
        await greet_redis(client)
    if client is not None:
        # What this process may admit by itself while Redis does not answer.
        local_share = settings.rate_limit_local_share / worker.count
        limiter = RedisRateLimiter(
            client,
            prefix=settings.redis_key_prefix,
            op_timeout=settings.rate_limit_redis_timeout,
            local_share=local_share,
            owns_client=own is not None,
        )
        await warn_if_evicting(client)
        if keys is not None:
            budgets = BudgetKeeper(
                client,
                prefix=settings.redis_key_prefix,
                op_timeout=settings.rate_limit_redis_timeout,
                local_share=local_share,
                labels=labels or KeyLabels(settings.metrics_max_keys),
            )
    else:
        limiter = MemoryRateLimiter(share=1 / worker.count)
    return Quotas(
        limiter,
        default=default_rate_limit(settings),
        overrides=rate_limit_overrides(settings),
        share=sequence_share(settings, worker),
        embedding_share=embedding_share(settings, worker),
        policies=no_policies if keys is None else keys.policy,
        budgets=budgets,
        admin=RateLimit(settings.admin_requests_per_minute),
    )


async def warn_if_evicting(client: redis.asyncio.Redis, wait: float = 2.0) -> None:
    """Warn when Redis may evict the rate-limit keys: under an allkeys-* policy any key may
    go, and a key's limit with it. Their keys have no TTL, so volatile-* policies keep them."""
    try:
        reply = await Deadline(wait).run(client.config_get("maxmemory-policy"))
        policy = reply.get("maxmemory-policy")
    except (TimeoutError, OSError, RedisError) as exc:
        # Managed Redis services often refuse CONFIG; not knowing is no reason to stop.
        logger.info("could not read redis maxmemory-policy (%s)", exc)
        return
    if isinstance(policy, bytes):
        policy = policy.decode()
    if isinstance(policy, str) and policy.startswith("allkeys-"):
        logger.warning(
            "redis maxmemory-policy is %s: under memory pressure it may evict rate-limit "
            "keys, and lift those limits. Use volatile-lru (every cache key has a TTL, the "
            "rate-limit keys have none), or give the rate limits a Redis of their own with "
            "SLUICEGATE_RATE_LIMIT_REDIS_URL",
            policy,
        )


async def enter_quotas(
    settings: Settings,
    stack: AsyncExitStack,
    client: redis.asyncio.Redis | None,
    worker: Worker,
    keys: KeyStore | None,
    labels: KeyLabels,
) -> Quotas:
    """`open_quotas`'s quotas for the lifespan, closed when `stack` unwinds; their budgets
    started, and closed before Redis is."""
    quotas = await open_quotas(settings, client, worker, keys, labels)
    stack.push_async_callback(quotas.limiter.close)
    if quotas.budgets is not None:
        quotas.budgets.start()
        # Before Redis closes: what was charged here is added there.
        stack.push_async_callback(quotas.budgets.close)
    return quotas
