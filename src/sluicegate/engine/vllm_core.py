"""One vLLM engine core for several front-end processes (`SLUICEGATE_WORKERS`).

vLLM's own machinery, as its server uses it for `--api-server-count N`: the supervisor binds
a pair of ZMQ listeners per worker (`bind_engine_zmq_listeners`) and launches the engine core
with their addresses (`launch_core_engines`); each worker adopts its pair, and its `AsyncLLM`
is one client of the core (`client_index` of `client_count`), sending its own requests and
receiving their outputs. The core runs out of the supervisor's process group, as it does out
of a single gateway's (`vllm_process`).

Importing this module imports nothing of vLLM; `launch` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CoreClient:
    """What a worker needs to be one client of a core the supervisor launched. Picklable:
    the supervisor hands it to the worker's process (its listeners go as file descriptors)."""

    index: int
    count: int
    addresses: dict[str, Any] = field(repr=False)
    """vLLM's `client_addresses`: the ZMQ addresses and listeners of this client."""

    def client_arguments(self) -> dict[str, Any]:
        """`AsyncLLM`'s keyword arguments that make it this client."""
        return {
            "client_addresses": dict(self.addresses),
            "client_count": self.count,
            "client_index": self.index,
        }


@dataclass
class LaunchedCore:
    """An engine core started for `len(clients)` workers."""

    clients: list[CoreClient]
    _launch: Any
    _listeners: Any
    """vLLM's `EngineZmqListeners`: kept for as long as the core runs, because dropping it
    unlinks the listeners' IPC paths, which a core still connecting would then never find
    (a worker then waits for its engine for ever)."""

    def watch(self, workers: Sequence[Any]) -> None:
        """Processes whose early exit aborts the core's start-up (vLLM watches them while it
        waits for the core): the workers, which adopt the core's listeners."""
        self._launch.watched_frontend_processes = list(workers)

    def handed_over(self) -> None:
        """The workers have their listeners: the supervisor's copies are closed (their IPC
        paths stay until `shutdown`)."""
        for listener in (*self._listeners.inputs, *self._listeners.outputs):
            listener.close()

    @property
    def processes(self) -> list[Any]:
        """The core's processes (`multiprocessing` processes, with sentinels)."""
        manager = self._launch.engine_manager
        return list(getattr(manager, "processes", ()))

    def shutdown(self, timeout: float | None) -> None:
        manager = self._launch.engine_manager
        if manager is not None:
            manager.shutdown(timeout=timeout)
        if self._launch.coordinator is not None:
            self._launch.coordinator.shutdown(timeout=timeout)
        self._listeners.cleanup()


@contextlib.contextmanager
def launch(vllm_config: Any, workers: int, log_stats: bool) -> Iterator[LaunchedCore]:
    """Launch the engine core of `vllm_config` (made with `clients=workers`, rank -1) for
    `workers` clients. Inside the block, start the workers with their `clients` and
    `watch` them; leaving it waits for the core to be ready (the model loaded), and fails if
    the core or a watched worker died first."""
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines

    from sluicegate.engine.vllm_process import executor_class

    listeners = bind_engine_zmq_listeners(vllm_config, workers)
    try:
        with launch_core_engines(
            vllm_config, executor_class(vllm_config), log_stats, listeners.addresses
        ) as started:
            clients = []
            for index, (given, taken) in enumerate(
                zip(listeners.inputs, listeners.outputs, strict=True)
            ):
                addresses: dict[str, Any] = {
                    "input_address": given.address,
                    "output_address": taken.address,
                    "input_listener": given.socket,
                    "output_listener": taken.socket,
                }
                if started.tensor_queue is not None:
                    addresses["tensor_queue"] = started.tensor_queue
                clients.append(CoreClient(index, workers, addresses))
            yield LaunchedCore(clients, started, listeners)
    except BaseException:
        listeners.cleanup()
        raise
