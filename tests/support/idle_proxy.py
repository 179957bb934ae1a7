"""A TCP proxy on loopback that cuts idle connections, as the proxies in front of a gateway do
(nginx's `proxy_read_timeout`, 60 s by default; AWS ALB's idle timeout, 60 s).

Each connection it accepts is joined to one of its own to `target`; once no byte has passed
in either direction for `idle` seconds, both are closed. It runs its own event loop on a
thread, so a test drives it from plain (blocking) code:

    with running_idle_proxy(gateway.url, idle=1.5) as proxy:
        httpx.get(proxy.url + "/v1/models")      # through the proxy
        proxy.cuts                               # connections it closed for being idle
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

CHUNK = 64 * 1024


class IdleProxy:
    """Forwards loopback connections to `host:port`, closing those idle for `idle` seconds."""

    def __init__(self, host: str, port: int, idle: float) -> None:
        self.host, self.port, self.idle = host, port, idle
        self.cuts = 0
        """Connections closed for being idle."""
        self.accepted = 0
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._joined, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, and close the connections still open."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in self._connections:
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections)

    async def _joined(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        try:
            target, to_target = await asyncio.open_connection(self.host, self.port)
        except OSError:
            to_client.close()
            return
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(CHUNK):
                    last[0] = loop.time()
                    writer.write(data)
                    await writer.drain()

        pipes = {
            asyncio.ensure_future(pipe(client, to_target)),
            asyncio.ensure_future(pipe(target, to_client)),
        }
        try:
            while True:
                left = last[0] + self.idle - loop.time()
                if left <= 0:
                    self.cuts += 1
                    break
                done, _ = await asyncio.wait(pipes, timeout=left)
                if done:  # one side closed: so does the other
                    break
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.wait(pipes)
            for writer in (to_client, to_target):
                writer.close()


@contextlib.contextmanager
def running_idle_proxy(target: str, idle: float) -> Iterator[IdleProxy]:
    """An `IdleProxy` to `target` (a URL; its host and port) for the block, on a thread."""
    parts = urlsplit(target)
    assert parts.hostname is not None and parts.port is not None, target
    proxy = IdleProxy(parts.hostname, parts.port, idle)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(proxy.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="idle-proxy", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the idle proxy did not start")
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
