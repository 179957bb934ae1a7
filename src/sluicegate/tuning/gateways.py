"""The gateways a tune runs its trials on: `sluicegate serve` in a process group of its own,
on a free loopback port, with today's settings less what would bias a trial or leak
(keys, Redis, the response cache, the usage ledger, a capture, tracing) and the trial's
engine knobs as flags. Its admission bounds change while it runs (`PUT /admin/admission`);
the one not in use is frozen (SIGSTOP to its group: engine core and workers too), so an idle
engine takes no core from the one being measured, as `bench/compare_vllm.py` does.

Each gateway holds a key of its own, made here and never written anywhere but its
environment: nothing else on the host can use a trial gateway while it lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import aiohttp

from sluicegate.settings import ENV_PREFIX
from sluicegate.tuning.reaper import reaper
from sluicegate.tuning.search import Config
from sluicegate.tuning.space import ADMISSION_KNOBS

NEUTRALISED = (
    "API_KEYS",
    "ADMIN_API_KEYS",
    "METRICS_API_KEYS",
    "METRICS_REQUIRE_AUTH",
    "MANAGED_KEYS",
    "USAGE_LEDGER",
    "REDIS_URL",
    "RATE_LIMIT_REDIS_URL",
    "REQUESTS_PER_MINUTE",
    "TOKENS_PER_MINUTE",
    "RATE_LIMIT_REQUESTS_PER_MINUTE",
    "RATE_LIMIT_TOKENS_PER_MINUTE",
    "RATE_LIMIT_OVERRIDES",
    "MAX_IN_FLIGHT_PER_KEY",
    "MAX_SEQUENCES_PER_KEY",
    "TRAFFIC_CAPTURE",
    "TRAFFIC_CAPTURE_SAMPLE",
    "TRAFFIC_CAPTURE_MAX_BYTES",
    "HOST",
    "PORT",
    "WORKERS",
)
"""Today's settings a trial gateway does not take (by name, less the prefix)."""

IN_FLIGHT = "sluicegate_requests_in_flight"
PR_SET_PDEATHSIG = 1
"""Linux's `prctl` option: the signal a process gets when its parent ends."""
READY_TIMEOUT = 900.0
"""Seconds an engine may take to start (a large model on a slow disk)."""


class GatewayFailed(Exception):
    """A trial gateway did not start or died; the message names its log."""


def trial_environment(base: Mapping[str, str], key: str) -> dict[str, str]:
    """`base` (the tune's environment) less what a trial gateway must not take, plus its
    own key and the settings every trial runs with."""
    env = {name: value for name, value in base.items() if _kept(name)}
    env.update({
        f"{ENV_PREFIX}API_KEYS": key,
        f"{ENV_PREFIX}ADMIN_API_KEYS": key,
        f"{ENV_PREFIX}CACHE_POLICY": "off",
        f"{ENV_PREFIX}WORKERS": "1",
        f"{ENV_PREFIX}ALLOW_RUNTIME_ADMISSION": "true",
        f"{ENV_PREFIX}LOG_FORMAT": "json",
        "OTEL_SDK_DISABLED": "true",
        "VLLM_NO_USAGE_STATS": "1",
    })  # fmt: skip
    return env


def _kept(name: str) -> bool:
    if name.startswith("OTEL_"):
        return False
    return not name.startswith(ENV_PREFIX) or name.removeprefix(ENV_PREFIX) not in NEUTRALISED


def dotenv_conflicts(dotenv: Path | None) -> list[str]:
    """Settings a `.env` file here sets that a trial gateway must not take: the gateway reads
    that file too, and a name left out of its environment cannot be kept out of the file."""
    if dotenv is None or not dotenv.is_file():
        return []
    names = []
    for line in dotenv.read_text(encoding="utf-8", errors="replace").splitlines():
        name = line.removeprefix("export ").partition("=")[0].strip().upper()
        if name.startswith(ENV_PREFIX) and not _kept(name):
            names.append(name)
    return names


def knob_flags(config: Config) -> list[str]:
    """`serve` flags for a configuration's knobs (`--max-num-seqs 32`,
    `--no-enable-prefix-caching`)."""
    flags: list[str] = []
    for name, value in config.knobs:
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class GatewayProcess:
    """One `sluicegate serve`, started by `start`, stopped by `stop`."""

    def __init__(self, engine: Config, log: Path, environ: Mapping[str, str] | None = None) -> None:
        self.engine = engine
        self.log = log
        self.key = "sk-tune-" + secrets.token_urlsafe(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = ""
        self.started_in = 0.0
        """Seconds from the process's start to ready."""
        self.frozen = False
        self._environ = os.environ if environ is None else environ
        self._process: asyncio.subprocess.Process | None = None
        self._frozen_groups: list[int] = []
        self._spawning: asyncio.Future[asyncio.subprocess.Process] | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def start(self) -> None:
        command = [
            sys.executable, "-m", "sluicegate", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), *knob_flags(self.engine),
        ]  # fmt: skip
        began = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes] = await asyncio.to_thread(self.log.open, "wb")
        try:
            # Shielded: a tune stopped while the process is being made must still find it
            # (`stop`), or the gateway would outlive the tune.
            self._spawning = asyncio.ensure_future(
                asyncio.create_subprocess_exec(
                    *command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=trial_environment(self._environ, self.key),
                    start_new_session=True,
                    preexec_fn=_end_with_parent,
                )
            )
            self._process = await asyncio.shield(self._spawning)
        finally:
            out.close()
        await self._wait_ready(READY_TIMEOUT)
        self.started_in = time.monotonic() - began
        self.model = await self._first_model()

    async def _wait_ready(self, within: float) -> None:
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.exited:
                    raise GatewayFailed(
                        f"the trial gateway exited before it was ready (see {self.log})"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(
                        self.url + "/ready", timeout=aiohttp.ClientTimeout(total=2)
                    ) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.5)
        await self.stop()
        raise GatewayFailed(f"the trial gateway was not ready in {within:.0f} s (see {self.log})")

    async def _first_model(self) -> str:
        try:
            async with (
                aiohttp.ClientSession(headers=self.headers) as session,
                session.get(self.url + "/v1/models") as response,
            ):
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise GatewayFailed(f"its models could not be read: {exc} (see {self.log})") from exc
        models = [m["id"] for m in body.get("data", ())]
        if not models:
            raise GatewayFailed(f"the trial gateway serves no model (see {self.log})")
        return str(models[0])

    @property
    def exited(self) -> bool:
        return self._process is None or self._process.returncode is not None

    async def set_admission(self, bounds: Mapping[str, object]) -> None:
        """The four admission bounds, as `PUT /admin/admission` takes them (None unsets)."""
        body = {name: bounds.get(name) for name in ADMISSION_KNOBS}
        await self._admin("PUT", "/admin/admission", body, "set its admission bounds")

    async def forget(self) -> None:
        """What its admission measured forgotten (`POST /admin/admission/reset`): the TTFT
        estimate of its next run is learnt anew, as a new gateway's is."""
        await self._admin("POST", "/admin/admission/reset", None, "reset its admission")

    async def _admin(self, method: str, path: str, body: object, what: str) -> None:
        try:
            async with (
                aiohttp.ClientSession(headers=self.headers) as session,
                session.request(
                    method, self.url + path, json=body, timeout=aiohttp.ClientTimeout(30)
                ) as response,
            ):
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayFailed(f"could not {what}: {exc} (see {self.log})") from exc
        if status != 200:
            raise GatewayFailed(
                f"the trial gateway would not {what} ({status}: {text[:200]}; see {self.log})"
            )

    async def settle(self, within: float = 60.0) -> bool:
        """Until the gateway has no request in flight and its engine none running or waiting
        (a stopped replay's cancelled requests reach the engine as aborts), so that the next
        run starts on an idle engine; False when `within` seconds were not enough."""
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and not self.exited:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(
                        self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)
                    ) as response:
                        if busy(await response.text()) == 0:
                            return True
                await asyncio.sleep(0.25)
        return False

    def freeze(self) -> None:
        """Stop the gateway and its engine where they are: the gateway's process group and
        the engine core's (a session of its own: `engine.vllm_process`), workers included."""
        if not self.exited and not self.frozen:
            self._frozen_groups = self._groups()
            reaper.watch(self._frozen_groups)  # continued should the tune die meanwhile
            for group in self._frozen_groups:
                _signal_group(group, signal.SIGSTOP)
            self.frozen = True

    async def thaw(self) -> None:
        if self.frozen:
            for group in self._frozen_groups:
                _signal_group(group, signal.SIGCONT)
            self.frozen = False
            await self._wait_ready(60.0)

    def _groups(self) -> list[int]:
        """The gateway's process group, then those of its children outside it."""
        if self._process is None:
            return []
        pid = self._process.pid
        groups = [pid]
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                group = os.getpgid(int(child))
                if group not in groups:
                    groups.append(group)
        return groups

    async def stop(self) -> None:
        if self._process is None and self._spawning is not None:
            with contextlib.suppress(OSError):
                self._process = await self._spawning
        process = self._process
        if process is None or process.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        for group in self._frozen_groups if self.frozen else [process.pid]:
            _signal_group(group, signal.SIGCONT)  # a frozen one sees its SIGTERM once thawed
        try:
            async with asyncio.timeout(60):
                await process.wait()
        except TimeoutError:
            self._signal(signal.SIGKILL)
            await process.wait()
        self.frozen = False

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is not None:
            _signal_group(self._process.pid, sig)


def _end_with_parent() -> None:
    """In the gateway's process, before it runs: SIGKILL when the tune is gone, however it
    went (even `kill -9`), so that no trial gateway outlives it (its engine core ends with it:
    `engine.vllm_process`)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


BUSY = (IN_FLIGHT, "vllm:num_requests_running", "vllm:num_requests_waiting")
"""What `/metrics` shows of work not done: the gateway's requests, the engine's."""


def busy(exposition: str) -> float:
    """The requests in flight in a gateway and running or waiting in its engine, as its
    `/metrics` shows them (each gauge summed over its labels)."""
    total = 0.0
    for line in exposition.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in BUSY:
            total += float(line.rsplit(" ", 1)[1])
    return total
