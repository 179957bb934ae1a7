"""What a tune leaves frozen when it dies: continued by a process of its own.

A trial gateway waits frozen (SIGSTOP to its process groups) while another runs. The gateway
process ends with the tune however the tune ends (`gateways._end_with_parent`), and its
engine core and workers end once they see the gateway gone (`engine.vllm_process`), but
only if they run: frozen, they see nothing, and would hold their memory (some 6 GB on CPU)
until someone continued them. So the first freeze starts the reaper: a small process in a
session of its own that reads the frozen groups from a pipe and, when the pipe ends (the
tune is gone, however it went: even `kill -9`), continues every group it was told of.
SIGCONT, not SIGKILL: a group id free again by then may be someone else's, and continuing a
process that runs does nothing.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterable

SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    groups.add(int(line))
for group in groups:
    try:
        os.killpg(group, signal.SIGCONT)
    except OSError:
        pass
"""


class Reaper:
    """Started at the first `watch`; its pipe's write end is this process's alone (children
    do not inherit it), so the pipe ends exactly when this process does, or at `close`."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def watch(self, groups: Iterable[int]) -> None:
        """Continue these process groups when this process ends."""
        lines = "".join(f"{group}\n" for group in groups).encode()
        if not lines:
            return
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-c", SCRIPT],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.write(lines)
            self._process.stdin.flush()

    def close(self) -> None:
        """End the pipe now (the groups told of are continued, harmlessly if they run) and
        wait for the reaper."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(BrokenPipeError):
            assert process.stdin is not None
            process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


reaper = Reaper()
"""The tune's reaper (one per process)."""
