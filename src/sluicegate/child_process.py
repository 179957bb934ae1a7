"""What the gateway's child processes do to stay out of its stop signals and end with it.

A stop signal can reach the whole process group (`kill -- -PID`, Ctrl+C in a terminal) or
every process of a cgroup (systemd's default `KillMode=control-group`). The gateway answers
it with a drain, and needs its children (the engine core, the parse worker) to go on serving
until the drain is over; it stops them itself afterwards. Each child also ends on its own
when the gateway is gone (killed with SIGKILL, or crashed), instead of lingering.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable

PARENT_WATCH_INTERVAL = 1.0
"""Seconds between two checks that the parent is still there."""


def ignore_stop_signals() -> None:
    """SIGTERM and SIGINT do nothing here; the parent stops this process another way."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def watch_parent(
    parent_pid: int,
    on_orphaned: Callable[[], None],
    interval: float = PARENT_WATCH_INTERVAL,
) -> threading.Thread:
    """Call `on_orphaned` (in a daemon thread) once `parent_pid` is no longer this process's
    parent: it exited, and the process was handed to init or a subreaper. Polling the parent
    id works whichever thread started the process, unlike Linux's PR_SET_PDEATHSIG, which
    fires when that thread ends."""

    def watch() -> None:
        stop = threading.Event()
        while os.getppid() == parent_pid:
            stop.wait(interval)
        on_orphaned()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def start_worker(parent_pid: int) -> None:
    """The initializer of a worker process that serves the gateway's calls: deaf to stop
    signals (the gateway ends it when the drain is over), gone at once with the gateway."""
    ignore_stop_signals()
    watch_parent(parent_pid, lambda: os._exit(0))


def exit_after_teardown(returning: bool = False) -> None:
    """Called in a spawned child (vLLM's engine core, as its executor shuts down; vLLM's
    worker, as it shuts down): when it is leaving on a stop request (`SystemExit` in flight,
    code 0, or with `returning` no exception at all: the child's function is about to return,
    which exits with code 0), the process ends at its first exit handler, once its own
    teardown is over and before the interpreter's, which took seconds in a process holding
    torch and a model. One leaving on an error keeps its exit code and its whole teardown; in
    the gateway's own process nothing changes."""
    leaving = sys.exc_info()[1]
    stopping = isinstance(leaving, SystemExit) and leaving.code in (None, 0)
    if not stopping and not (returning and leaving is None):
        return
    if multiprocessing.parent_process() is None:
        return
    atexit.register(_exit_now)


def _exit_now() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to write
            stream.flush()
    os._exit(0)
