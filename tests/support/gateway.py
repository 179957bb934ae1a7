"""Start a real `sluicegate serve` process (real vLLM engine) on a free loopback port."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import psutil

MODEL_NAME = "SmolLM2-135M-Instruct"
START_TIMEOUT_S = 420.0
"""How long a gateway, or a group started together, may take to be ready. pytest's own
timeout (pyproject.toml) is above it, so a start that fails says why rather than being cut."""


def free_port() -> int:
    """A loopback port number free now. Whoever binds it later may find it taken meanwhile:
    servers in this process take a socket from `fakes.loopback_socket` instead, and a gateway
    that finds its port taken is started again on another (`wait_until_ready`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PORT_TAKEN = ("sluicegate: cannot take 127.0.0.1:", "is taken by another sluicegate gateway")
"""What `sluicegate serve` says when it stops because its port is taken (`ports.hold_port`,
before any engine starts)."""

PORT_TRIES = 3


@dataclass(eq=False)
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    workers: int = 1
    """`SLUICEGATE_WORKERS`: with more than one, ready once every worker listens."""
    flags: tuple[str, ...] | None = None
    env: dict[str, str] | None = None
    """How `launch_gateway` launched it: to start it again on another port if its port was
    taken (None: launched otherwise, never started again)."""
    port_tries: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        _started.discard(self)
        return int(self.process.returncode)


LANE_ENV = "GATEWAY_TEST_LANE"
"""Set by scripts/test_tiers.py to `lane/lanes` when a tier runs in processes side by side."""


def engine_core() -> dict[str, str]:
    """The core the engines this test process starts compute on. vLLM's CPU backend binds a
    single-process engine to core 0 by default (keeping the rest for the API server), so the
    engines of two test processes side by side (the integration tier's lanes, or pytest-xdist
    workers) would share one core while the other idles: each process gets one of its own."""
    lane, lanes = (int(part) for part in os.environ.get(LANE_ENV, "0/1").split("/"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if lanes == 1 and not worker.startswith("gw"):
        return {}
    index = lane + lanes * (int(worker[2:]) if worker.startswith("gw") else 0)
    return {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}


def gateway_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every test gateway runs with: offline, small KV cache and context, and
    under pytest-xdist, its worker's own core for a single-process engine."""
    extra = extra or {}
    tensor_parallel = int(extra.get("SLUICEGATE_TENSOR_PARALLEL_SIZE", "1")) > 1
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "SLUICEGATE_CPU_KVCACHE_SPACE_GIB": "1",
        "SLUICEGATE_MAX_MODEL_LEN": "2048",
        **({} if tensor_parallel else engine_core()),
        **extra,
    }


def launch_gateway(log_dir: Path, *flags: str, env: dict[str, str] | None = None) -> GatewayProcess:
    """Start `sluicegate serve` and return at once, before it is ready."""
    port = free_port()
    environment = gateway_env(env)
    workers = environment.get("SLUICEGATE_WORKERS", "1")
    if "--workers" in flags:
        workers = flags[flags.index("--workers") + 1]
    log_path = log_dir / f"gateway-{port}.log"
    gateway = GatewayProcess(
        _popen(port, log_path, flags, environment), port, log_path, int(workers), flags, env
    )
    _started.add(gateway)
    return gateway


def _popen(
    port: int, log_path: Path, flags: tuple[str, ...], environment: dict[str, str]
) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--port", str(port), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )


def _relaunched_on_a_free_port(gateway: GatewayProcess) -> bool:
    """If `gateway` stopped because its port was taken between `free_port` and its bind (it
    checks the port first thing, so that costs seconds): started again, in place, on another
    port, up to `PORT_TRIES` ports in all. Whether it was."""
    gateway.port_tries += 1
    if gateway.flags is None or gateway.port_tries >= PORT_TRIES:
        return False
    if not any(says in gateway.log() for says in PORT_TAKEN):
        return False
    gateway.port = free_port()
    gateway.log_path = gateway.log_path.with_name(f"gateway-{gateway.port}.log")
    gateway.process = _popen(
        gateway.port, gateway.log_path, gateway.flags, gateway_env(gateway.env)
    )
    return True


def start_gateway(log_dir: Path, *flags: str, env: dict[str, str] | None = None) -> GatewayProcess:
    return wait_until_ready(launch_gateway(log_dir, *flags, env=env))


_started: set[GatewayProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    """Gateways still running when the test process exits (a fixture that never tore down, an
    interrupted run) are stopped rather than left holding an engine's memory."""
    for gateway in list(_started):
        gateway.stop(timeout=10)


@contextlib.contextmanager
def running_gateway(
    log_dir: Path, *flags: str, env: dict[str, str] | None = None
) -> Iterator[GatewayProcess]:
    """A gateway for the block: the one way fixtures start one; stopped however the block ends."""
    with running_gateways(log_dir, GatewaySpec(flags, env)) as (gateway,):
        yield gateway


@dataclass(frozen=True)
class GatewaySpec:
    """How one of several gateways started together runs: its CLI flags and environment."""

    flags: tuple[str, ...] = ()
    env: dict[str, str] | None = None


@contextlib.contextmanager
def running_gateways(log_dir: Path, *specs: GatewaySpec) -> Iterator[list[GatewayProcess]]:
    """Several gateways for the block, started at once. Start-ups are CPU-bound: on two cores a
    pair is ready in about 1.6 times one start-up (about 33 s idle), three took as long as
    three in turn, and each holds an engine's memory (about 4 GB here) for the whole block.
    Start pairs."""
    launched: list[GatewayProcess] = []
    try:
        for spec in specs:
            launched.append(launch_gateway(log_dir, *spec.flags, env=spec.env))
        deadline = time.monotonic() + START_TIMEOUT_S  # one for the group: they start together
        for gateway in launched:
            wait_until_ready(gateway, deadline)
        yield launched
    finally:
        for gateway in launched:
            gateway.stop()


def wait_until_ready(gateway: GatewayProcess, deadline: float | None = None) -> GatewayProcess:
    """Wait for `/ready` to answer 200, and with several workers for the supervisor's word that
    all of them listen (one answering says nothing of the others, which take no connections
    until they do); stop the process and raise if it exits or is not ready by `deadline` (a
    `time.monotonic()`; `START_TIMEOUT_S` from now if not given)."""
    if deadline is None:
        deadline = time.monotonic() + START_TIMEOUT_S
    all_serving = f"all {gateway.workers} workers serving"
    # Asked often at first (an upstream-mode gateway is ready in about 2 s), then less
    # (an engine takes 30-60 s to start).
    quick_until = time.monotonic() + 10
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None and _relaunched_on_a_free_port(gateway):
            continue
        process = gateway.process
        if process.poll() is not None:
            raise RuntimeError(
                f"gateway exited with {process.returncode}:\n{gateway.log()[-4000:]}"
            )
        try:
            ready = httpx.get(f"{gateway.url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready and (gateway.workers == 1 or all_serving in gateway.log()):
            return gateway
        time.sleep(0.1 if time.monotonic() < quick_until else 0.5)
    gateway.stop()
    raise RuntimeError(f"gateway not ready in time:\n{gateway.log()[-4000:]}")


class PortTaken(RuntimeError):
    """A peer server stopped at start because its port was taken after `free_port` chose it."""


def _listens(pid: int, port: int | None) -> bool:
    """Whether process `pid`, or one of its children, listens on `port`."""
    try:
        parent = psutil.Process(pid)
        family = {parent.pid, *(child.pid for child in parent.children(recursive=True))}
    except psutil.NoSuchProcess:
        return False
    return any(
        conn.status == psutil.CONN_LISTEN
        and conn.laddr
        and conn.laddr.port == port
        and conn.pid in family
        for conn in psutil.net_connections(kind="inet")
    )


@contextlib.contextmanager
def peer_process(
    command: list[str],
    ready_url: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Iterator[subprocess.Popen[bytes]]:
    """A server of another project (vLLM's, llama.cpp's, the fault upstream), running until
    `ready_url` answers 200, and stopped (its whole process group) when the block ends."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                error = PortTaken if "address already in use" in tail.lower() else RuntimeError
                raise error(f"{command[:3]} exited with {process.returncode}:\n{tail}")
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    if not _listens(process.pid, urlsplit(ready_url).port):
                        # Another server answered on the port this one was to take.
                        raise PortTaken(f"{command[:3]}: {ready_url} answered by another process")
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[:3]} not ready after {timeout:g} s")
            time.sleep(0.2)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@contextlib.contextmanager
def vllm_server(
    log_dir: Path,
    *flags: str,
    served_model_name: str = MODEL_NAME,
    port: int | None = None,
    model: Path | None = None,
) -> Iterator[str]:
    """vLLM's own OpenAI server on the bundled model, or the model folder `model` (float32,
    eager, a 2,048-token window, a 1 GiB KV cache), with `flags` added, on `port` (by default
    a free one, and another if it was taken before vLLM bound it); yields its base URL
    (ending in /v1)."""
    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **engine_core()}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    serving = False
    for _ in range(PORT_TRIES if port is None else 1):
        chosen = port or free_port()
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model or bundled_model_dir(Settings().model_cache_dir)),
            "--served-model-name", served_model_name, "--host", "127.0.0.1",
            "--port", str(chosen), "--max-model-len", "2048", "--dtype", "float32",
            "--enforce-eager", "--disable-uvicorn-access-log", *flags,
        ]  # fmt: skip
        log = log_dir / f"vllm-{served_model_name}-{chosen}.log"
        try:
            with peer_process(command, f"http://127.0.0.1:{chosen}/health", log, env):
                serving = True
                yield f"http://127.0.0.1:{chosen}/v1"
                return
        except PortTaken:
            if port is not None or serving:
                raise
    raise RuntimeError(f"vLLM's server did not start: {PORT_TRIES} ports taken in turn")


T = TypeVar("T")


@contextlib.contextmanager
def started_together(*managers: contextlib.AbstractContextManager[T]) -> Iterator[list[T]]:
    """Enter context managers that start servers at once (each in a thread: start-ups are
    CPU-bound, a pair is ready in about 1.6 times one), and leave them all when the block
    ends, however it ends."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(stack.enter_context, manager) for manager in managers]
        wait(futures)
        # Every start has ended (entered or failed), so the stack holds all that started.
        yield [future.result() for future in futures]
