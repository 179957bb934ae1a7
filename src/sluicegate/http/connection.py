"""Time limits on an HTTP/1.1 connection that uvicorn has no setting for.

`guarded_protocol` makes a subclass of uvicorn's httptools protocol (passed as
`uvicorn.Config(http=...)`) that closes a connection

- whose request head (request line and headers) has not arrived within `head_timeout`
  seconds, counted from the connection (for its first request) or from the first byte of a
  later request. A head that had begun gets a 408; an idle new connection is just closed.
  Without this, a client trickling header bytes (slowloris) holds a connection for ever;
- whose writes stay blocked for `write_timeout` seconds because the client reads nothing.
  The connection is aborted, dropping what is buffered for it, so a client that stops
  reading holds neither memory nor a socket. The app sees the client gone.

It bounds the connections served at once to `max_connections`, decided when each is
accepted: the first `max_connections` open at a time are served; a connection past them is
marked (`http.asgi.OVER_CONNECTION_LIMIT`), its request refused by `http.admission` with a
503 `overloaded` in OpenAI's envelope and `Retry-After`, then closed. A slot freed before its
request arrived is given to it instead. uvicorn's own `limit_concurrency` is not used: it
counts every open connection at each request, its first ones included, so a burst past it
was served to nobody, in plain text. While every slot is taken, a served connection closes
after its response instead of idling kept alive, so the clients waiting get its slot.

It also tells the app when a request's body had arrived whole before the app began
(`http.asgi.body_received`), as a small body does in the head's own read: `http.body_limits`
then reads it without a timer, which is a cost on the hottest path (cache hits).

Idle kept-alive connections and body read time are bounded by uvicorn's own settings and
`http.body_limits`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluicegate.errors import RequestTimeoutError
from sluicegate.http.asgi import BODY_RECEIVED, OVER_CONNECTION_LIMIT

logger = logging.getLogger(__name__)


def guarded_protocol(
    head_timeout: float, write_timeout: float, max_connections: int
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with these limits (one set of slots per server)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "head_timeout": head_timeout,
            "write_timeout": write_timeout,
            "slots": ConnectionSlots(max_connections),
        },
    )


class ConnectionSlots:
    """The connections served at once: at most `limit`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.taken = 0

    @property
    def full(self) -> bool:
        return self.taken >= self.limit

    def take(self) -> bool:
        if self.full:
            return False
        self.taken += 1
        return True

    def give_back(self) -> None:
        self.taken -= 1


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    head_timeout: float = 10.0
    write_timeout: float = 60.0
    slots: ConnectionSlots  # set by `guarded_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_begun = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._has_slot = False

    # ---- the request head ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._has_slot = self.slots.take()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def on_headers_complete(self) -> None:
        self._head_begun = False
        self._cancel_head_timer()
        if not self._has_slot:
            self._has_slot = self.slots.take()  # one may have been freed since the accept
        if not self._has_slot:
            self.scope.setdefault("extensions", {})[OVER_CONNECTION_LIMIT] = {}
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope and self.slots.full:
            # Refused, or served while others wait for a slot: closed after this response.
            cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        # The app's task was only scheduled at the end of the head: if the body is complete
        # before it runs, its whole read returns at once.
        if cycle is not None and not cycle.more_body:
            self.scope.setdefault("extensions", {})[BODY_RECEIVED] = {}

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        logger.debug("closing a connection whose request head took over %s s", self.head_timeout)
        # A 408 only where it cannot land in the middle of another response.
        if self._head_begun and (self.cycle is None or self.cycle.response_complete):
            error = RequestTimeoutError(
                f"The request line and headers did not arrive within {self.head_timeout:g} s."
            )
            body = json.dumps(error.to_body()).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    # ---- a client that reads nothing ---------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def _write_timed_out(self) -> None:
        self._write_timer = None
        logger.info("dropping a connection whose client read nothing for %s s", self.write_timeout)
        self.transport.abort()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_write_timer()
        if self._has_slot:
            self._has_slot = False
            self.slots.give_back()
        super().connection_lost(exc)
