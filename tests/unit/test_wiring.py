"""`wiring`: each package's config object built from Settings."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio

from sluicegate import wiring
from sluicegate.engine.protocol import EngineLoad
from sluicegate.engine.upstream.server import Upstream
from sluicegate.quota.redis_limiter import RedisRateLimiter
from sluicegate.settings import Settings
from tests.support.redis_server import RedisProcess, shared_redis_url


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_default_max_tokens_respects_max_tokens_limit() -> None:
    policy = wiring.budget_policy(settings(max_tokens_limit=100))
    assert (policy.default_max_tokens, policy.min_completion_tokens) == (100, 16)


def test_engine_config_carries_every_engine_setting(tmp_path: Path) -> None:
    config = wiring.engine_config(
        settings(max_model_len=2048, max_num_seqs=8, scheduling_policy="priority"), str(tmp_path)
    )
    assert (config.model, config.max_model_len, config.max_num_seqs) == (str(tmp_path), 2048, 8)
    assert config.scheduling_policy == "priority"
    assert config.served_model_name == "SmolLM2-135M-Instruct"
    parallel = wiring.engine_config(
        settings(data_parallel_size=2, distributed_executor_backend="mp"), str(tmp_path)
    )
    assert (parallel.data_parallel_size, parallel.distributed_executor_backend) == (2, "mp")


def test_rate_limit_overrides_become_limits() -> None:
    overrides = {"key-0123456789ab": {"requests_per_minute": 3}}
    limits = wiring.rate_limit_overrides(settings(rate_limit_overrides=overrides))
    assert limits["key-0123456789ab"].requests_per_minute == 3
    assert limits["key-0123456789ab"].tokens_per_minute is None


async def test_the_upstream_timeouts_reach_its_client_and_the_retry_burst_its_budget() -> None:
    config = wiring.upstream_config(
        settings(
            upstream_urls="http://10.0.0.1:8000/v1",
            upstream_connect_timeout=1.5,
            upstream_read_timeout=2.5,
            upstream_write_timeout=3.5,
            upstream_pool_timeout=4.5,
            upstream_retry_burst=3,
        )
    )
    url, weight = config.urls[0]
    upstream = Upstream(url, weight, config.pool, config.breaker)
    try:
        timeout = httpx.Timeout(connect=1.5, read=2.5, write=3.5, pool=4.5)
        assert upstream.client.timeout == timeout
    finally:
        await upstream.close()
    assert config.retry.burst == 3
    assert wiring.upstream_config(settings()).retry.burst == 5


# ---- redis and quotas ----------------------------------------------------------------------


async def test_the_redis_pool_is_bounded_and_waits_for_a_connection() -> None:
    config = settings(redis_url=shared_redis_url(), redis_max_connections=3)
    client = wiring.open_redis(config)
    assert client is not None
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
        assert pool.max_connections == 3
        # Six pings at once through three connections: the others wait, none fails.
        assert await asyncio.gather(*(client.ping() for _ in range(6))) == [True] * 6
    finally:
        await client.aclose()


def test_the_sequence_share_is_half_the_engine_with_keys_and_none_without() -> None:
    with_keys = wiring.sequence_share(settings(api_keys="sk-a", max_num_seqs=10))
    assert with_keys.per_key == 5 and not with_keys.prioritize
    assert wiring.sequence_share(settings(max_num_seqs=10)).per_key is None
    chosen = wiring.sequence_share(
        settings(api_keys="sk-a", max_sequences_per_key=7, scheduling_policy="priority")
    )
    assert chosen.per_key == 7 and chosen.prioritize
    assert chosen.keyed and not wiring.sequence_share(settings()).keyed


def test_key_priorities_come_from_json_within_their_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLUICEGATE_KEY_PRIORITIES", '{"key-0123456789ab": -3}')
    share = wiring.sequence_share(settings(scheduling_policy="priority"))
    assert share.priorities == {"key-0123456789ab": -3}
    with pytest.raises(ValueError, match="1000"):
        settings(key_priorities={"key-0123456789ab": 1001})


def test_engine_state_bounds_warn_where_the_engine_reports_no_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class NoState:
        def load(self) -> None:
            return None

    class Idle:
        def load(self) -> EngineLoad:
            return EngineLoad(0, 0, 0.0)

    bounded = wiring.admission(settings(max_engine_waiting=8, max_kv_cache_usage=0.9))
    with caplog.at_level(logging.WARNING, logger="sluicegate.inference.admission"):
        limits = bounded.of(Idle()).limits  # type: ignore[arg-type]
        assert not caplog.records
        bounded.of(NoState())  # type: ignore[arg-type]
        wiring.admission(settings()).of(NoState())  # type: ignore[arg-type]
    assert (limits.max_waiting, limits.max_running, limits.max_kv_cache_usage) == (8, None, 0.9)
    assert len(caplog.records) == 1 and "upstreams report none" in caplog.messages[0]


async def test_rate_limits_take_their_own_redis_when_given_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limits_redis = RedisProcess(tmp_path)
    limits_redis.start()
    try:
        config = settings(rate_limit_redis_url=limits_redis.url, rate_limit_requests_per_minute=5)
        with caplog.at_level(logging.WARNING, logger="sluicegate.wiring"):
            quotas = await wiring.open_quotas(config, None)
        assert isinstance(quotas.limiter, RedisRateLimiter)
        await quotas.admit("key-a", 0, 0)
        keys = redis.Redis(port=limits_redis.port).keys("sluicegate:gcra:*")
        assert keys == [b"sluicegate:gcra:{key-a}:req"]
        await quotas.limiter.close()
        assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    finally:
        limits_redis.kill()


async def test_an_evicting_redis_for_rate_limits_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisProcess(tmp_path)
    server.start()
    try:
        redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")
        client = wiring.open_redis(settings(redis_url=server.url))
        assert client is not None
        with caplog.at_level(logging.WARNING, logger="sluicegate.wiring"):
            quotas = await wiring.open_quotas(settings(redis_url=server.url), client)
        await quotas.limiter.close()
        await client.aclose()
        [warning] = [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert "allkeys-lru" in warning.getMessage()
        assert "volatile-lru" in warning.getMessage()
        assert "RATE_LIMIT_REDIS_URL" in warning.getMessage()
    finally:
        server.kill()


def test_the_bundled_model_gets_the_shipped_template_and_hermes(tmp_path: Path) -> None:
    config = wiring.engine_config(settings(), str(tmp_path))
    assert config.chat_template is not None and "<tool_call>" in config.chat_template
    assert config.tool_call_parser == "hermes"
    assert wiring.request_limits(settings(max_tools=3)).tools.max_tools == 3


def test_other_models_keep_their_template_and_get_no_parser_unless_set(tmp_path: Path) -> None:
    other = settings(model=str(tmp_path))
    assert (wiring.chat_template(other), wiring.tool_call_parser(other)) == (None, None)
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    chosen = settings(model=str(tmp_path), chat_template=template, tool_call_parser="pythonic")
    assert wiring.chat_template(chosen) == "{{ messages }}"
    assert wiring.tool_call_parser(chosen) == "pythonic"
    assert wiring.tool_call_parser(settings(tool_call_parser="none")) is None


def test_the_reasoning_parser_goes_to_the_engine_when_set(tmp_path: Path) -> None:
    assert wiring.engine_config(settings(), str(tmp_path)).reasoning_parser is None
    chosen = settings(model=str(tmp_path), reasoning_parser="qwen3")
    assert wiring.engine_config(chosen, str(tmp_path)).reasoning_parser == "qwen3"
    assert wiring.reasoning_parser(settings(reasoning_parser="none")) is None


def test_a_missing_template_file_is_refused_at_start(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        settings(chat_template=tmp_path / "missing.jinja")


def test_a_pool_takes_its_entrys_reasoning_parser_or_the_setting_for_upstream_urls() -> None:
    from sluicegate.models.config import ModelEntry, UpstreamEntry

    entry = ModelEntry(
        name="r1",
        upstreams=[UpstreamEntry(url="http://10.0.0.1:8000/v1")],
        tokenizer="/models/r1",
        reasoning_parser="deepseek_r1",
    )
    assert wiring.upstream_config(settings(), entry).reasoning_parser == "deepseek_r1"
    assert wiring.upstream_config(settings(reasoning_parser="qwen3"), entry).reasoning_parser == (
        "deepseek_r1"
    )
    plain = entry.model_copy(update={"reasoning_parser": None})
    pooled = wiring.upstream_config(settings(reasoning_parser="qwen3"), plain)
    assert pooled.reasoning_parser is None
    shorthand = settings(
        upstream_urls="http://10.0.0.1:8000/v1", tokenizer="/models/q", reasoning_parser="qwen3"
    )
    assert wiring.upstream_config(shorthand).reasoning_parser == "qwen3"
    none = settings(upstream_urls="http://10.0.0.1:8000/v1", reasoning_parser="none")
    assert wiring.upstream_config(none).reasoning_parser is None
