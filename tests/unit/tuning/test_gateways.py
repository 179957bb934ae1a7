"""A tune's trial gateways: what they take of today's environment and what they do not, their
knobs as `serve` flags, and a real `sluicegate serve` process driven as a tune drives it
(upstream-only over the fault upstream: no engine to load, ready in seconds): started, its
admission bounds set, frozen and thawed, stopped, and stopped while it was being started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from sluicegate.tuning.gateways import (
    GatewayProcess,
    dotenv_conflicts,
    knob_flags,
    trial_environment,
)
from sluicegate.tuning.search import Config
from tests.support import fault_upstream


def test_a_trial_gateway_takes_today_less_what_would_bias_or_leak() -> None:
    env = trial_environment(
        {
            "PATH": "/bin",
            "SLUICEGATE_MAX_MODEL_LEN": "2048",
            "SLUICEGATE_REDIS_URL": "redis://db:6379/0",
            "SLUICEGATE_API_KEYS": "sk-real",
            "SLUICEGATE_USAGE_LEDGER": "true",
            "SLUICEGATE_TRAFFIC_CAPTURE": "/var/traffic.jsonl",
            "SLUICEGATE_WORKERS": "4",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        },
        "sk-tune-x",
    )
    assert env["PATH"] == "/bin" and env["SLUICEGATE_MAX_MODEL_LEN"] == "2048"
    for gone in ("SLUICEGATE_REDIS_URL", "SLUICEGATE_USAGE_LEDGER", "SLUICEGATE_TRAFFIC_CAPTURE"):
        assert gone not in env
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env and env["OTEL_SDK_DISABLED"] == "true"
    assert env["SLUICEGATE_API_KEYS"] == env["SLUICEGATE_ADMIN_API_KEYS"] == "sk-tune-x"
    assert env["SLUICEGATE_WORKERS"] == "1" and env["SLUICEGATE_CACHE_POLICY"] == "off"
    assert env["SLUICEGATE_ALLOW_RUNTIME_ADMISSION"] == "true"


def test_a_dotenv_setting_a_trial_gateway_must_not_take_is_named(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        "SLUICEGATE_MAX_NUM_SEQS=64\n"
        "export SLUICEGATE_REDIS_URL=redis://x\n"
        "# SLUICEGATE_API_KEYS=a\n"
    )
    assert dotenv_conflicts(dotenv) == ["SLUICEGATE_REDIS_URL"]
    assert dotenv_conflicts(tmp_path / "none") == [] and dotenv_conflicts(None) == []


def test_knobs_become_serve_flags() -> None:
    config = Config.of({"max_num_seqs": 16, "enable_prefix_caching": False, "ttft_objective": 1.5})
    assert knob_flags(config) == [
        "--no-enable-prefix-caching", "--max-num-seqs", "16", "--ttft-objective", "1.5",
    ]  # fmt: skip


@contextlib.contextmanager
def upstream(folder: Path) -> Iterator[dict[str, str]]:
    server = fault_upstream.start(0, log=folder / "upstream.log")
    try:
        yield {"PATH": "/usr/bin:/bin", "SLUICEGATE_UPSTREAM_URLS": server.url}
    finally:
        server.stop()


async def answers(url: str, within: float) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=within)) as reply,
        ):
            return reply.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def test_a_trial_gateway_runs_freezes_thaws_and_stops(tmp_path: Path) -> None:
    with upstream(tmp_path) as environ:
        gateway = GatewayProcess(Config(), tmp_path / "logs" / "today.log", environ)
        try:
            await gateway.start()
            assert gateway.model and gateway.started_in > 0
            await gateway.set_admission({"max_engine_running": 4})
            async with (
                aiohttp.ClientSession(headers=gateway.headers) as session,
                session.get(gateway.url + "/admin/admission") as reply,
            ):
                assert (await reply.json())["max_engine_running"] == 4
            await gateway.forget()  # its admission measurements: the bounds stay
            async with (
                aiohttp.ClientSession(headers=gateway.headers) as session,
                session.get(gateway.url + "/admin/admission") as reply,
            ):
                assert (await reply.json())["max_engine_running"] == 4
            # Its key, and no other, opens it.
            async with (
                aiohttp.ClientSession() as session,
                session.get(gateway.url + "/v1/models") as reply,
            ):
                assert reply.status == 401
            await gateway.settle()
            gateway.freeze()
            processes = [psutil.Process(pid) for pid in gateway._groups()]
            for _ in range(100):  # a signal is delivered when the kernel next runs it
                if all(p.status() == psutil.STATUS_STOPPED for p in processes):
                    break
                await asyncio.sleep(0.05)
            assert [p.status() for p in processes] == [psutil.STATUS_STOPPED] * len(processes)
            assert not await answers(gateway.url, within=1.0)
            await gateway.thaw()
            assert await answers(gateway.url, within=5.0)
        finally:
            await gateway.stop()
        assert gateway.exited
        assert not psutil.pid_exists(processes[0].pid) or processes[0].status() == "zombie"


async def test_a_tune_stopped_while_its_gateway_starts_leaves_no_process(tmp_path: Path) -> None:
    with upstream(tmp_path) as environ:
        gateway = GatewayProcess(Config(), tmp_path / "logs" / "trial.log", environ)
        starting = asyncio.ensure_future(gateway.start())
        await asyncio.sleep(0)  # the process is being made
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await gateway.stop()
        assert gateway.exited or gateway._process is None
        if gateway._process is not None:
            assert not psutil.pid_exists(gateway._process.pid)
