"""A small HTTP server on a loopback address for the media tests, in the test's own event loop:
each path answers as a route says (an image, a redirect, an error, a drip, a body past a
bound), and the server counts the connections that reach it (a canary: on an address the
policy refuses, it must count none)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from PIL import Image

Route = Callable[[asyncio.StreamWriter], Awaitable[None]]


def png(width: int = 8, height: int = 8, color: tuple[int, ...] = (200, 40, 40)) -> bytes:
    mode = "RGBA" if len(color) == 4 else "RGB"
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color).save(buffer, "PNG")
    return buffer.getvalue()


def answer(
    body: bytes, status: str = "200 OK", headers: dict[str, str] | None = None, length: bool = True
) -> Route:
    """A route that answers `body` whole (with a content-length unless `length` is False:
    then chunked)."""

    async def route(writer: asyncio.StreamWriter) -> None:
        head = {"content-type": "image/png", **(headers or {})}
        if length:
            head["content-length"] = str(len(body))
        else:
            head["transfer-encoding"] = "chunked"
        lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
        writer.write(f"HTTP/1.1 {status}\r\n{lines}\r\n".encode())
        if length:
            writer.write(body)
        else:
            for start in range(0, len(body), 65536):
                piece = body[start : start + 65536]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    return route


def redirect(location: str, status: str = "302 Found") -> Route:
    return answer(b"", status, {"location": location})


def drip(every: float) -> Route:
    """Headers, then one byte of a PNG every `every` seconds, for ever."""

    async def route(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: 1000\r\n\r\n")
        for byte in png() * 10:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every)

    return route


@dataclass
class MediaServer:
    host: str
    port: int = 0
    routes: dict[str, Route] = field(default_factory=dict)
    connections: int = 0
    requests: list[str] = field(default_factory=list)
    """The path of each request, in order."""

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                path = head.split(b" ", 2)[1].decode()
                self.requests.append(path)
                route = self.routes.get(path, answer(b"not here", "404 Not Found"))
                await route(writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def media_server(
    host: str, routes: dict[str, Route] | None = None
) -> AsyncIterator[MediaServer]:
    served = MediaServer(host, routes=dict(routes or {}))
    server = await asyncio.start_server(served._serve, host, 0)
    served.port = server.sockets[0].getsockname()[1]
    try:
        yield served
    finally:
        server.close()
