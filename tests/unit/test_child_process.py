"""A worker started with `start_worker`: deaf to stop signals, gone with its parent; a child
leaving on a stop request ends before the interpreter's teardown (`exit_after_teardown`)."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sluicegate import child_process

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


# The engine core's exit (`exit_after_teardown`), in spawned processes as vLLM starts its
# core: one leaving on a stop request ends at its first exit handler, skipping what the
# interpreter's teardown would run after (in a real core, seconds of it: past the gateway's
# grace, so every stop killed the core); one leaving on an error keeps its code and its
# whole teardown.


def _leave_the_teardown_a_mark(marker: str) -> None:
    Path(marker).write_text("the interpreter's teardown ran")


def _core(code: int | None, marker: str) -> None:
    """A core's last steps: a handler of the kind the interpreter runs on its way out
    (registered first, so run last), then vLLM's busy loop leaving with `code`."""
    atexit.register(_leave_the_teardown_a_mark, marker)
    try:
        raise SystemExit(code)
    finally:
        child_process.exit_after_teardown()


def _run(code: int | None, tmp_path: Path) -> tuple[int | None, bool]:
    marker = tmp_path / "teardown"
    process = multiprocessing.get_context("spawn").Process(target=_core, args=(code, str(marker)))
    process.start()
    process.join(120)
    return process.exitcode, marker.exists()


@pytest.mark.parametrize("code", [None, 0])
def test_a_core_stopped_on_request_ends_before_the_interpreters_teardown(
    code: int | None, tmp_path: Path
) -> None:
    assert _run(code, tmp_path) == (0, False)


def test_a_core_leaving_with_an_error_code_keeps_it_and_its_teardown(tmp_path: Path) -> None:
    assert _run(3, tmp_path) == (3, True)


def test_in_the_gateways_own_process_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # No parent process: the core runs in the gateway (VLLM_ENABLE_V1_MULTIPROCESSING=0).
    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    try:
        raise SystemExit(0)
    except SystemExit:
        child_process.exit_after_teardown()
    assert registered == []


# vLLM's worker (`engine.vllm_worker`): its process function shuts the worker down in a
# `finally` and returns (code 0), a stop request having been handled, or with a stop signal's
# `SystemExit` in flight.


def _worker(error: bool, marker: str) -> None:
    """A worker's last steps: a handler of the interpreter's teardown (registered first, so
    run last), then vLLM's loop ending (a stop handled, or an error left in flight), and the
    worker's shutdown in the `finally`."""
    atexit.register(_leave_the_teardown_a_mark, marker)
    try:
        try:
            raise RuntimeError("the stopped queue")
        except RuntimeError:
            if error:
                raise
    finally:
        child_process.exit_after_teardown(returning=True)


def _run_worker(error: bool, tmp_path: Path) -> tuple[int | None, bool]:
    marker = tmp_path / "teardown"
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_worker, args=(error, str(marker)))
    process.start()
    process.join(120)
    return process.exitcode, marker.exists()


def test_a_worker_returning_after_its_shutdown_ends_before_the_interpreters_teardown(
    tmp_path: Path,
) -> None:
    assert _run_worker(False, tmp_path) == (0, False)


def test_a_worker_leaving_on_an_error_keeps_its_code_and_its_teardown(tmp_path: Path) -> None:
    assert _run_worker(True, tmp_path) == (1, True)


def test_the_stopping_worker_is_vllms_pick_with_a_shutdown_that_asks_for_the_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from sluicegate.engine import vllm_worker

    asked: list[bool] = []
    monkeypatch.setattr(
        vllm_worker, "exit_after_teardown", lambda returning: asked.append(returning)
    )
    name = vllm_worker.stopping_worker_name(f"{__name__}.PickedWorker")
    made = resolve_obj_by_qualname(name)
    assert made.__mro__[1] is PickedWorker
    assert resolve_obj_by_qualname(name) is made  # made once
    worker = made()
    worker.shutdown()
    assert (worker.shut, asked) == (True, [True])
    with pytest.raises(AttributeError):
        vllm_worker.Missing  # noqa: B018


class PickedWorker:
    """Stands in for the worker class vLLM's platform picks."""

    shut = False

    def shutdown(self) -> None:
        self.shut = True
