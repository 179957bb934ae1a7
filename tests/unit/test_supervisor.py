"""The supervisor of several workers (`--workers 2`), as `sluicegate serve` runs it, in upstream
mode over the fault upstream (no engine to load): a worker that stops answering is noticed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.support import fault_upstream
from tests.support.gateway import (
    GatewayProcess,
    free_port,
    gateway_env,
    launch_gateway,
    wait_until_ready,
)
from tests.support.redis_server import shared_redis_url


@contextlib.contextmanager
def _upstream(folder: Path) -> Iterator[str]:
    upstream = fault_upstream.start(0, log=folder / "upstream.log")
    try:
        yield upstream.url
    finally:
        upstream.stop()


@contextlib.contextmanager
def _gateway(folder: Path, upstream: str) -> Iterator[GatewayProcess]:
    env = {
        "SLUICEGATE_UPSTREAM_URLS": upstream,
        "SLUICEGATE_REDIS_URL": shared_redis_url(),
        "SLUICEGATE_SHUTDOWN_TIMEOUT": "5",
        "SLUICEGATE_WORKER_STALL_TIMEOUT": "2",
    }
    gateway = launch_gateway(folder, "--workers", "2", env=env)
    try:
        # No engine to load: ready in seconds, and within the unit tier's pytest timeout.
        yield wait_until_ready(gateway, time.monotonic() + 120)
    finally:
        # A stopped worker takes no SIGTERM: the whole group goes, however the test ended.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gateway.process.pid, signal.SIGCONT)
        gateway.stop(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gateway.process.pid, signal.SIGKILL)


def _workers(gateway: GatewayProcess) -> list[psutil.Process]:
    children = psutil.Process(gateway.process.pid).children()
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def test_a_worker_that_stops_answering_is_killed_and_the_gateway_exits(tmp_path: Path) -> None:
    """A worker whose event loop has no turn for WORKER_STALL_TIMEOUT (here: stopped) would
    keep its share of the port's new connections unanswered for good. The supervisor kills it;
    then, as after a crash, the other drains and the gateway exits for its orchestrator to
    start it again."""
    with _upstream(tmp_path) as upstream, _gateway(tmp_path, upstream) as gateway:
        workers = _workers(gateway)
        assert len(workers) == 2
        workers[0].send_signal(signal.SIGSTOP)
        try:
            # Expected within the 2 s timeout and a 5 s drain: the bound only guards a hang.
            code = gateway.process.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        assert code not in (None, 0), "the supervisor did not notice the stopped worker"
        log = gateway.log()
        assert f"(pid {workers[0].pid}) has not run its event loop" in log
        assert not workers[1].is_running() or workers[1].status() == psutil.STATUS_ZOMBIE


def test_workers_that_answer_are_left_alone(tmp_path: Path) -> None:
    """The same timeout while both workers' loops turn: nothing is killed."""
    with _upstream(tmp_path) as upstream, _gateway(tmp_path, upstream) as gateway:
        with contextlib.suppress(subprocess.TimeoutExpired):
            gateway.process.wait(5)
        assert gateway.process.poll() is None
        assert "has not run its event loop" not in gateway.log()


_UP_TO_THE_FIRST_WORKER = """
import multiprocessing.context, os, sys
from sluicegate import cli

def start(process):
    loaded = ("fastapi", "starlette", "uvicorn", "sluicegate.app", "sluicegate.server")
    print(",".join(m for m in loaded if m in sys.modules) or "nothing", flush=True)
    os._exit(0)

multiprocessing.context.SpawnProcess.start = start
sys.exit(cli.main(["serve", "--workers", "2"]))
"""
"""`sluicegate serve --workers 2` up to the moment its supervisor starts the first worker,
which prints what of the app the supervisor had loaded by then."""


def test_the_supervisor_starts_its_workers_without_loading_the_app() -> None:
    # Every worker loads the app; a supervisor that did too would add its own second or more
    # of imports, on the same cores, before any worker began (ran: ci, every multi-worker
    # start in the suite).
    env = gateway_env(
        {
            "SLUICEGATE_UPSTREAM_URLS": "http://127.0.0.1:9/v1",
            "SLUICEGATE_REDIS_URL": shared_redis_url(),
            "SLUICEGATE_PORT": str(free_port()),
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", _UP_TO_THE_FIRST_WORKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "nothing", (done.stdout, done.stderr[-2000:])
