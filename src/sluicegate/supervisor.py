"""Several front-end processes over one engine: `SLUICEGATE_WORKERS` > 1.

One Python process serves on one core: HTTP, templating and tokenizing, SSE, cache hits and
upstream streams all share its event loop. The supervisor (this process) lets N workers share
that work, as vLLM's `--api-server-count N` does for its own server:

1. It takes the port (SO_REUSEPORT, after `ports.hold_port` made sure no other gateway or
   server has it); each worker listens on it with a socket of its own, and
   the kernel spreads new connections over them (by a hash of the client's address and
   port). One socket shared by all would not: the worker already awake, busy with streams,
   took every new connection while the idle one slept. A worker listens only once its
   start-up is done, and says so (`Worker.now_serving`); the supervisor logs when all do.
2. It makes the counts the workers share (`counters`): requests in flight overall and per
   key, each key's sequences, each engine's load.
3. It launches each in-process engine's core (`engine.vllm_core`, vLLM's own machinery),
   with a client slot per worker, and starts the workers (`server.run_worker`); the cores'
   start-up fails if a worker dies first.
4. It waits. SIGTERM or SIGINT is passed on to every worker, which drains; a second one
   tells them to stop now (`worker.STOP_NOW`). When an engine core dies it tells the workers
   (`worker.CORE_DIED`): their requests end with `engine_unavailable`, they drain and exit
   with code 3. When a worker exits on its own (a crash, its engine's death) the others are
   drained too: one worker cannot be replaced (its client slot of the core is gone), so the
   gateway exits and its supervisor (Docker, Kubernetes) starts it again. A serving worker
   whose event loop has had no turn for `worker_stall_timeout` (its heartbeat, `_Watch`) is
   killed, and goes the same way.
5. Once every worker is gone it stops the cores and exits: 0, 3 after an engine's death, or
   the first failing worker's code.

Metrics: every worker writes its series to files under a directory made here
(`PROMETHEUS_MULTIPROC_DIR`); any worker's `/metrics` merges them (`observability.exposition`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import FrameType
from typing import TYPE_CHECKING, Any

from sluicegate.lifecycle import ENGINE_DEATH_EXIT_CODE
from sluicegate.settings import Settings
from sluicegate.worker import STOP_NOW, Worker

if TYPE_CHECKING:
    from sluicegate.counters import Board
    from sluicegate.ports import HeldPort

logger = logging.getLogger(__name__)

CORE_STOP_TIMEOUT = 10.0
"""Seconds the engine cores have to stop once the workers are gone, before SIGKILL."""


@dataclass
class _Stop:
    """Stop signals received, passed on to the workers."""

    workers: list[Any] = field(default_factory=list)
    shared: list[Any] = field(default_factory=list)
    """The shared counts: kept alive here for as long as the workers run (their locks are
    named semaphores, unlinked when the supervisor's objects go)."""
    signals: int = 0
    serving: bool = False

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if not self.serving:
            # Still starting (loading the model): give up the start.
            raise SystemExit(0)
        tell = signal.SIGTERM if self.signals == 1 else STOP_NOW
        logger.info("%s: passed on to the workers", signal.Signals(sig).name)
        _signal_all(self.workers, tell)


def supervise(settings: Settings, port: HeldPort | None = None) -> int:
    """Run `settings.workers` workers until they are stopped; the exit code as `serve`'s.
    `port`: the port, held already (`ports.hold_port`; taken here if not): the workers join
    it with listening sockets of their own (`server.run_worker`), and only listening sockets
    receive connections."""
    metrics_dir = tempfile.mkdtemp(prefix="sluicegate-metrics-")
    # Before the workers import prometheus-client, which reads it once.
    from sluicegate.observability.exposition import MULTIPROCESS_DIR

    os.environ[MULTIPROCESS_DIR] = metrics_dir
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop.handle)
    signal.signal(signal.SIGINT, stop.handle)
    if port is None:
        from sluicegate.ports import hold_port

        port = hold_port(settings)
    cores: dict[str, Any] = {}
    workers = stop.workers
    try:
        with contextlib.ExitStack() as starting:
            announcing, heartbeats = _start(settings, cores, workers, stop.shared, starting)
        # Leaving the block waited for every engine core to be ready.
        stop.serving = True
        logger.info(
            "%d workers started (pids %s), each listening once its start-up is done",
            len(workers),
            ", ".join(str(w.pid) for w in workers),
        )
        watch = _Watch(workers, heartbeats, settings.worker_stall_timeout)
        where = f"{settings.host}:{settings.port}"
        return _wait(workers, cores, metrics_dir, announcing, where, watch)
    finally:
        if not stop.serving:
            # The start failed or was given up: the workers started so far go too.
            _signal_all(workers, STOP_NOW)
            for worker in workers:
                worker.join(CORE_STOP_TIMEOUT)
                if worker.is_alive():
                    worker.kill()
        port.close()
        for core in cores.values():
            core.shutdown(timeout=CORE_STOP_TIMEOUT)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _start(
    settings: Settings,
    cores: dict[str, Any],
    workers: list[Any],
    shared: list[Any],
    starting: contextlib.ExitStack,
) -> tuple[list[Connection], Board]:
    """Launch the engine cores (within `starting`, whose end waits for them) and the workers,
    into `cores` and `workers`; what they share into `shared`. Returns the pipes on which each
    worker says that it is serving (`Worker.now_serving`), and the workers' heartbeats."""
    from sluicegate.counters import Board, SharedTally
    from sluicegate.wiring.entries import local_engine_configs
    from sluicegate.wiring.reasoning import workers_key
    from sluicegate.worker import GENERATIVE

    count = settings.workers
    context = multiprocessing.get_context("spawn")
    # Live keys at most: the overall count, and per request in flight its key's requests
    # and sequences.
    tally = SharedTally(keys=2 * settings.max_in_flight + 2, context=context)
    boards: dict[str, Board] = {}
    heartbeats = Board.shared(count, context)
    for index in range(count):
        heartbeats.values[index] = math.inf  # watched once serving
    shared += [tally, boards, heartbeats]
    for kind, config in local_engine_configs(settings).items():
        cores[kind] = starting.enter_context(_launch_core(kind, config, count))
        if kind == GENERATIVE:
            from sluicegate.engine.vllm_load import LoadMeter

            size = LoadMeter.board_size(getattr(config, "data_parallel_size", 1))
            boards[kind] = Board.shared(size, context)
    announcing: list[Connection] = []
    reasoning_key = workers_key(settings)
    for index in range(count):
        reader, writer = context.Pipe(duplex=False)
        worker = Worker(
            index=index,
            count=count,
            tally=tally,
            cores={kind: core.clients[index] for kind, core in cores.items()},
            boards=boards,
            serving=writer,
            heartbeats=heartbeats,
            reasoning_key=reasoning_key,
        )
        process = context.Process(
            target=_run_worker,
            name=f"sluicegate-worker-{index}",
            args=(settings, worker),
        )
        process.start()
        # The worker holds its own end now: a worker that dies before serving closes the pipe.
        writer.close()
        workers.append(process)
        announcing.append(reader)
    for core in cores.values():
        core.handed_over()
        core.watch(workers)
    return announcing, heartbeats


def _run_worker(settings: Settings, worker: Worker) -> None:
    """A worker process's entry point: `server.run_worker`, imported there, so that the
    supervisor itself never loads the app (a second or more of start-up before any worker
    begins its own)."""
    from sluicegate.server import run_worker

    run_worker(settings, worker)


@contextlib.contextmanager
def _launch_core(kind: str, config: Any, count: int) -> Any:
    from sluicegate.engine import vllm_core
    from sluicegate.engine.vllm_embeddings import embedding_vllm_config
    from sluicegate.engine.vllm_engine import engine_vllm_config
    from sluicegate.worker import GENERATIVE

    generative = kind == GENERATIVE
    make = engine_vllm_config if generative else embedding_vllm_config
    vllm_config = make(config, clients=count, rank=-1)
    logger.info("starting the %s engine core for %d workers", kind, count)
    with vllm_core.launch(vllm_config, count, log_stats=generative) as core:
        yield core


def _wait(
    workers: list[Any],
    cores: dict[str, Any],
    metrics_dir: str,
    announcing: list[Connection],
    where: str,
    watch: _Watch,
) -> int:
    from prometheus_client import multiprocess

    from sluicegate.worker import CORE_DIED

    live = {w.sentinel: w for w in workers}
    core_processes = {p.sentinel: (kind, p) for kind, core in cores.items() for p in core.processes}
    waiting = set(announcing)
    serving = 0
    code = 0
    while live:
        ready_ones = multiprocessing.connection.wait(
            [*live, *core_processes, *waiting], timeout=watch.interval
        )
        watch.kill_stalled(live)
        for ready in ready_ones:
            if ready in waiting:
                waiting.discard(ready)
                # EOF: the worker died before it served (its sentinel says so).
                with contextlib.suppress(EOFError, OSError):
                    ready.recv()
                    serving += 1
                    if serving == len(workers):
                        logger.info("all %d workers serving on %s", serving, where)
                ready.close()
                continue
            if ready in core_processes:
                kind, process = core_processes.pop(ready)
                process.join(1)
                logger.error(
                    "the %s engine core (pid %s) died with code %s: the workers drain, then "
                    "the gateway exits with code %d",
                    kind,
                    process.pid,
                    process.exitcode,
                    ENGINE_DEATH_EXIT_CODE,
                )
                code = code or ENGINE_DEATH_EXIT_CODE
                _signal_all(live.values(), CORE_DIED)
                continue
            worker = live.pop(ready)
            worker.join()
            multiprocess.mark_process_dead(worker.pid, metrics_dir)  # type: ignore[no-untyped-call]
            exit_code = worker.exitcode
            if exit_code != 0 and not code:
                code = exit_code if exit_code and exit_code > 0 else 1
                logger.error(
                    "worker %s (pid %s) exited with code %s: the others drain, then the "
                    "gateway exits with code %d",
                    worker.name,
                    worker.pid,
                    exit_code,
                    code,
                )
                _signal_all(live.values(), signal.SIGTERM)
            elif exit_code == 0 and live and not code:
                logger.info("worker %s (pid %s) stopped", worker.name, worker.pid)
    return code


@dataclass
class _Watch:
    """The workers' heartbeats (`Worker.beat`, each turn of a worker's event loop): a serving
    worker silent for `stall_timeout` seconds is stuck (a call that never yields, a stopped
    process) and keeps its share of the port's connections unanswered, so it is killed. It
    cannot be replaced in place (its client slot of the engine core goes with it): its exit
    then drains the others and ends the gateway, as a crash does, for the orchestrator to
    restart it."""

    workers: list[Any]
    heartbeats: Board
    stall_timeout: float
    killed: set[int] = field(default_factory=set)
    checked: float = field(default_factory=time.monotonic)

    @property
    def interval(self) -> float:
        return min(1.0, self.stall_timeout / 4)

    def kill_stalled(self, live: dict[Any, Any]) -> None:
        now = time.monotonic()
        checked, self.checked = self.checked, now
        if now - checked > self.stall_timeout / 2:
            return  # the supervisor was not running either (the host or container was frozen)
        for index, worker in enumerate(self.workers):
            silent = now - self.heartbeats.values[index]
            if silent <= self.stall_timeout or index in self.killed or worker.sentinel not in live:
                continue
            self.killed.add(index)
            logger.error(
                "worker %s (pid %s) has not run its event loop for %.0f s "
                "(SLUICEGATE_WORKER_STALL_TIMEOUT): killed",
                worker.name,
                worker.pid,
                silent,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)


def _signal_all(workers: Any, sig: int) -> None:
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, sig)
