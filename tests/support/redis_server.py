"""Redis servers of the tests' own, on free ports: one a module can kill, freeze and pause, and one
that a test process shares among its tests."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.gateway import free_port


@dataclass
class RedisProcess:
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    pauses: list[threading.Thread] = field(default_factory=list)
    persist: bool = False
    """Write every change to an append-only file first: a server killed and started again
    (`start`) comes back with everything it had answered."""
    started_once: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server, and wait until it answers. Its port is a number found free a
        moment before: taken meanwhile, the server exits, and on its first start it is
        started again on another (a server started again must keep its port)."""
        for _ in range(3):
            if self._started_here():
                self.started_once = True
                return
            assert not self.started_once, f"port {self.port} was taken while Redis was down"
            self.port = free_port()
        raise AssertionError("test redis did not start: three ports taken in turn")

    def _started_here(self) -> bool:
        """Whether the server started on `port` (False: it exited, its port taken)."""
        binary = shutil.which("redis-server")
        assert binary, "redis-server is installed by `make test` (scripts/ensure-redis.sh)"
        durability = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persist
            else ["--appendonly", "no"]
        )
        self.process = process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *durability, "--dir", str(self.folder), "--enable-debug-command", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(
            port=self.port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        deadline = time.monotonic() + 10
        try:
            while process.poll() is None:
                try:
                    # This server's answer, not that of whoever else holds the port.
                    if client.info("server")["process_id"] == process.pid:
                        return True
                except redis.RedisError:  # not up yet, or another server's
                    pass
                assert time.monotonic() < deadline, "test redis did not start"
                time.sleep(0.05)
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        # A pause outlives neither the server nor the test that made it: left running, its
        # thread would retry against the dead server while later tests count allocations.
        for thread in self.pauses:
            thread.join(10)
        self.pauses.clear()

    def freeze(self) -> None:
        """SIGSTOP: the server holds every connection open and answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def pause(self, seconds: float) -> None:
        """Block the server for `seconds` (DEBUG SLEEP), without waiting for it here."""
        client = redis.Redis(
            port=self.port, socket_timeout=seconds + 5, retry=Retry(NoBackoff(), 0)
        )

        def sleep() -> None:
            with contextlib.suppress(redis.RedisError):
                client.execute_command("DEBUG", "SLEEP", str(seconds))
            client.close()

        thread = threading.Thread(target=sleep, daemon=True)
        thread.start()
        self.pauses.append(thread)

    async def across_a_pause(
        self, client: redis.asyncio.Redis, op: Callable[[], Awaitable[object]], pause: float
    ) -> tuple[BaseException | None, bool]:
        """Run `op` through `client` (a pool of one connection) while the server sleeps for
        `pause` seconds (DEBUG SLEEP, begun before `op`). What `op` raised, and whether the
        pool's connection afterwards is the one it had before (the same client id): a short
        pause must cost no connection."""
        before = await client.client_id()
        self.pause(pause)
        await asyncio.to_thread(self.wait_until_paused)
        raised: BaseException | None = None
        try:
            await op()
        except Exception as exc:  # what it raised is the answer
            raised = exc
        # Waits for the pool's one connection, which the op holds until Redis answers it.
        after = await client.client_id()
        return raised, before == after

    def wait_until_awake(self, within: float = 60.0) -> None:
        """Until every pause has ended (its DEBUG SLEEP answered): what the server had queued
        meanwhile is run by then."""
        deadline = time.monotonic() + within
        for thread in self.pauses:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), f"Redis still paused after {within:g} s"

    def wait_until_paused(self) -> None:
        """Until a pause has begun: a ping of its own goes unanswered."""
        probe = redis.Redis(port=self.port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 5
        try:
            while True:
                try:
                    probe.ping()
                except redis.TimeoutError:
                    return
                assert time.monotonic() < deadline, "Redis did not pause"
                time.sleep(0.01)
        finally:
            probe.close()


@contextlib.contextmanager
def running_redis(folder: Path, persist: bool = False) -> Iterator[RedisProcess]:
    """A Redis server of its own, killed when the block ends."""
    server = RedisProcess(folder, persist=persist)
    server.start()
    try:
        yield server
    finally:
        server.kill()


_shared: RedisProcess | None = None


def shared_redis_url() -> str:
    """The Redis this test process's tests share, each under a key prefix of its own: a server
    of its own on a free port, started on first use and killed when the process exits. So no
    Redis need be running beforehand, and parallel test processes never meet in one."""
    global _shared
    if _shared is None:
        server = RedisProcess(Path(tempfile.mkdtemp(prefix="sluicegate-test-redis-")))
        server.start()
        atexit.register(server.kill)
        _shared = server
    return _shared.url


def cache_entries(client: redis.Redis, prefix: str) -> list[bytes]:
    """The response cache's entries under `prefix` (their locks left out)."""
    return [k for k in client.scan_iter(match=f"{prefix}:cache:*") if not k.endswith(b":lock")]


async def written_cache_entries(client: redis.Redis, prefix: str, count: int) -> list[bytes]:
    """The response cache's entries under `prefix`, once there are `count`: a flight writes
    its entry after its response is sent (`cache.flight`), so a client can read the answer
    before the entry is stored. An entry that is never written fails the test at pytest's
    own timeout."""
    while True:
        found = cache_entries(client, prefix)
        if len(found) >= count:
            return found
        await asyncio.sleep(0.01)  # polled: Redis tells no one of a write


async def rewritten_cache_entry(client: redis.Redis, key: bytes, old: bytes) -> None:
    """Once the entry at `key` holds something other than `old`: a miss rewrites the entry it
    could not use after its response is sent, as a flight writes a new one
    (`written_cache_entries`)."""
    while True:
        if client.get(key) != old:
            return
        await asyncio.sleep(0.01)  # polled: Redis tells no one of a write
