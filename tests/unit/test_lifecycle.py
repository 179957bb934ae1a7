"""The engine watcher: the engine's death starts the drain, with a non-zero exit code."""

from __future__ import annotations

import asyncio

from sluicegate.errors import EngineUnavailableError
from sluicegate.lifecycle import ENGINE_DEATH_EXIT_CODE, Lifecycle


class Engine:
    def __init__(self) -> None:
        self.checks = 0
        self.dead = False

    async def check_health(self) -> None:
        self.checks += 1
        if self.dead:
            raise EngineUnavailableError()


async def test_a_healthy_engine_is_left_alone() -> None:
    lifecycle, engine = Lifecycle(drain_timeout=5), Engine()
    watcher = asyncio.create_task(lifecycle.watch_engine(engine.check_health, interval=0.01))
    for _ in range(500):  # until three checks have run (30 ms alone), or 5 s at the least
        if engine.checks >= 3:
            break
        await asyncio.sleep(0.01)
    assert engine.checks >= 3
    assert not lifecycle.draining and lifecycle.exit_code == 0
    watcher.cancel()


async def test_the_engines_death_starts_the_drain_with_exit_code_3() -> None:
    lifecycle, engine = Lifecycle(drain_timeout=5), Engine()
    lifecycle.in_flight = 1
    watcher = asyncio.create_task(lifecycle.watch_engine(engine.check_health, interval=0.01))
    await asyncio.sleep(0.05)
    engine.dead = True
    await asyncio.wait_for(watcher, 5)  # the next check, 10 ms on
    assert lifecycle.draining and not lifecycle.drained()  # what is in flight may finish
    assert lifecycle.exit_code == ENGINE_DEATH_EXIT_CODE
    assert "engine died (EngineUnavailableError)" in lifecycle.exit_reason
    lifecycle.in_flight = 0
    assert lifecycle.drained()


def test_a_death_during_a_sigterm_drain_still_exits_non_zero() -> None:
    lifecycle = Lifecycle(drain_timeout=5)
    lifecycle.begin_drain()
    assert lifecycle.exit_code == 0
    lifecycle.begin_drain(ENGINE_DEATH_EXIT_CODE, "the engine died")
    assert lifecycle.exit_code == ENGINE_DEATH_EXIT_CODE
    lifecycle.begin_drain()
    assert lifecycle.exit_code == ENGINE_DEATH_EXIT_CODE
