"""The engine core's processes, kept out of the gateway's process group.

vLLM spawns its engine core as a child of the gateway, and the core spawns its workers
(`VLLM::Worker`, on CPU too); each installs a SIGTERM handler that aborts every request. A
stop signal sent to the gateway's whole group (`kill -- -PID`, Ctrl+C in a terminal) would
reach them as well: the streams the gateway means to drain would end at once, and the
gateway would take the core's exit for a death. So the core, as it builds its executor and
before its workers exist, moves into a session of its own, which the workers inherit; the
gateway stops it when its drain is over (`AsyncLLM.shutdown`: SIGTERM, then SIGKILL after
a grace). Out of the gateway's group, the core also ends by itself once the gateway is gone.

A core stopped that way has nothing left to do once vLLM's own teardown is over (its
workers gone, its scheduler and queues shut), but the interpreter's own teardown of a
process that holds torch and the model took seconds more here: past the gateway's grace
(`AsyncLLM.shutdown`'s 5 s), so every stop waited the whole grace and then killed the core.
So a core leaving on a stop request ends at its first exit handler
(`child_process.exit_after_teardown`), and so do its workers (`vllm_worker`), which it waits
for.

Importing this module imports vLLM: the engine imports it when it starts.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from typing import Any

from vllm.v1.executor.abstract import Executor
from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from sluicegate.child_process import exit_after_teardown, watch_parent
from sluicegate.engine.vllm_worker import stopping_worker_name

logger = logging.getLogger(__name__)

ORPHAN_GRACE = 10.0
"""Seconds an orphaned engine core has to end after its own SIGTERM, before SIGKILL."""


def detach_from_gateway() -> None:
    """In the engine core's process: a session of its own, and an end with the gateway's."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None or os.getsid(0) == os.getpid():
        # The core runs in the gateway's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0), or
        # has detached already (an executor built again).
        return
    os.setsid()
    watch_parent(parent.pid, _stop_orphaned_core)


def _stop_orphaned_core() -> None:
    logger.warning("the gateway is gone: stopping the engine core (pid %d)", os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # vLLM's own handler: abort, tear down, exit
    time.sleep(ORPHAN_GRACE)
    # Still alive: the core and its workers are this session's one process group.
    os.killpg(os.getpgrp(), signal.SIGKILL)


class DetachedMultiprocExecutor(MultiprocExecutor):
    def _init_executor(self) -> None:
        detach_from_gateway()
        # Its workers end once vLLM's teardown is over (`vllm_worker`), as the core does.
        parallel = self.vllm_config.parallel_config
        parallel.worker_cls = stopping_worker_name(parallel.worker_cls)
        super()._init_executor()

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[no-untyped-call]  # vLLM's is not annotated
        exit_after_teardown()


class DetachedUniProcExecutor(UniProcExecutor):
    def _init_executor(self) -> None:
        detach_from_gateway()
        super()._init_executor()

    def shutdown(self) -> None:
        super().shutdown()
        exit_after_teardown()


_DETACHED: dict[type[Any], type[Any]] = {
    MultiprocExecutor: DetachedMultiprocExecutor,
    UniProcExecutor: DetachedUniProcExecutor,
}


def executor_class(vllm_config: Any) -> type[Any]:
    """vLLM's choice of executor for `vllm_config`, detached when it is one of its own
    process executors. Others (Ray's) are left as vLLM has them, in the gateway's group."""
    chosen: type[Any] = Executor.get_class(vllm_config)
    return _DETACHED.get(chosen, chosen)
