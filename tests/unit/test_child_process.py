"""A worker started with `start_worker`: deaf to stop signals, gone with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

WORKER = "import os, time; from sluicegate.child_process import start_worker; " + (
    "start_worker(os.getppid()); print('ready', flush=True); time.sleep(120)"
)

PARENT = textwrap.dedent(
    f"""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", {WORKER!r}], stdout=subprocess.PIPE)
    assert worker.stdout.readline() == b"ready\\n"
    print(worker.pid, flush=True)
    time.sleep(120)
    """
)


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_ignores_stop_signals_and_ends_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    worker = psutil.Process(int(parent.stdout.readline()))
    try:
        for stop in (signal.SIGTERM, signal.SIGINT):
            os.kill(worker.pid, stop)
        time.sleep(0.5)
        assert alive(worker), "a stop signal ended the worker"

        parent.kill()
        parent.wait(10)
        killed = time.monotonic()
        while alive(worker):
            # It checks for its parent every second: 20 s is over 5 times that under load.
            assert time.monotonic() - killed < 20, "the worker outlived its parent by 20 s"
            time.sleep(0.1)
        print(f"worker ended {time.monotonic() - killed:.1f} s after its parent")
    finally:
        parent.kill()
        parent.wait(10)
        if alive(worker):
            worker.kill()
