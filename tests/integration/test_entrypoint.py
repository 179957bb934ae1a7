"""The images' entrypoint and health check, run on the host: no Docker needed.

The entrypoint finds `sluicegate` on PATH, as in the images; here PATH starts with this
virtual environment's bin folder. It runs with no arguments, as the images' `CMD ["serve"]`
does in effect, so the settings come from SLUICEGATE_* variables alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from tests.support.gateway import (
    MODEL_NAME,
    PORT_TAKEN,
    PORT_TRIES,
    GatewayProcess,
    free_port,
    gateway_env,
    wait_until_ready,
)

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"


def healthcheck(port: int) -> int:
    env = {**os.environ, "SLUICEGATE_PORT": str(port)}
    command = [sys.executable, str(HEALTHCHECK)]
    return subprocess.run(command, env=env, capture_output=True, timeout=30).returncode


def _entrypoint(tmp_path: Path, port: int) -> GatewayProcess:
    env = gateway_env(
        {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "SLUICEGATE_HOST": "127.0.0.1",
            "SLUICEGATE_PORT": str(port),
        }
    )
    log_path = tmp_path / f"entrypoint-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(ENTRYPOINT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return GatewayProcess(process, port, log_path)


def _started(tmp_path: Path) -> GatewayProcess:
    """The entrypoint's gateway, ready; on another port if its port was taken meanwhile."""
    for _ in range(PORT_TRIES):
        gateway = _entrypoint(tmp_path, free_port())
        try:
            return wait_until_ready(gateway)
        except RuntimeError:
            gateway.stop()
            if not any(says in gateway.log() for says in PORT_TAKEN):
                raise
    raise RuntimeError(f"the entrypoint did not start: {PORT_TRIES} ports taken in turn")


def test_the_entrypoint_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    gateway = _started(tmp_path)
    process, port = gateway.process, gateway.port
    try:
        # exec'd: the process the container runtime signals is the server, not a shell.
        command_line = " ".join(psutil.Process(process.pid).cmdline())
        assert "sluicegate" in command_line and "entrypoint.sh" not in command_line

        models = httpx.get(f"{gateway.url}/v1/models", timeout=10).json()
        assert [model["id"] for model in models["data"]] == [MODEL_NAME]
        assert healthcheck(port) == 0

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, gateway.log()[-4000:]
    finally:
        gateway.stop()
    assert healthcheck(port) == 1
