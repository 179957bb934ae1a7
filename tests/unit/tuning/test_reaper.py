"""A tune that dies while a trial gateway is frozen leaves nothing frozen: its reaper
continues the groups it was told of, however the tune went (here `kill -9`), and at a
clean end too. Real processes: a sleeper in a group of its own stands for a frozen engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from sluicegate.tuning.reaper import Reaper

# A tune that freezes a group and then waits to be killed.
TUNE = """
import os, signal, sys, time
from sluicegate.tuning.reaper import reaper
group = int(sys.argv[1])
reaper.watch([group])
os.killpg(group, signal.SIGSTOP)
print("frozen", flush=True)
time.sleep(600)
"""


def status_becomes(pid: int, wanted: str, within: float = 30.0) -> str:
    """The process's status once it is `wanted`, or what it still is after `within` s: a
    bound on a hang, not a figure."""
    deadline = time.monotonic() + within
    status = psutil.Process(pid).status()
    while status != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        status = psutil.Process(pid).status()
    return status


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def test_a_tune_killed_while_a_group_is_frozen_leaves_it_running() -> None:
    frozen = sleeper()
    try:
        tune = subprocess.Popen(
            [sys.executable, "-c", TUNE, str(frozen.pid)], stdout=subprocess.PIPE
        )
        assert tune.stdout is not None and tune.stdout.readline().strip() == b"frozen"
        assert status_becomes(frozen.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
        tune.kill()
        tune.wait()
        assert status_becomes(frozen.pid, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING
    finally:
        frozen.kill()
        frozen.wait()


def test_closing_continues_what_was_told_and_a_second_watch_starts_anew() -> None:
    frozen = sleeper()
    reaper = Reaper()
    try:
        reaper.watch([])  # nothing to watch: no process started
        assert reaper._process is None
        reaper.watch([frozen.pid])
        os.killpg(frozen.pid, signal.SIGSTOP)
        assert status_becomes(frozen.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
        reaper.close()
        assert status_becomes(frozen.pid, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING
        reaper.watch([frozen.pid])
        assert reaper._process is not None and reaper._process.poll() is None
    finally:
        reaper.close()
        frozen.kill()
        frozen.wait()
