"""Stream reading: an upstream's streamed answer read into engine steps, and its try settled.

`events` turns the answer's body into steps (the first of them is read by the dispatcher,
before which a failure is retried); `rest` passes on the first and the others. Once output
has been passed on, a failure ends the response with an error (the stream layer sends an
error event, then `[DONE]`): a retry would repeat or contradict what the client already has.
Closing the steps (the client left) closes the upstream response, and with it the
connection, at once.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import cast

import httpx

from sluicegate.engine.protocol import EngineStep
from sluicegate.engine.upstream.exchange import Exchange, count, end
from sluicegate.engine.upstream.reads import coalesced
from sluicegate.engine.upstream.wire import StreamReader, UpstreamStreamError
from sluicegate.errors import BadGatewayError

logger = logging.getLogger(__name__)


async def events(
    reader: StreamReader, response: httpx.Response, reads_whole: bool
) -> AsyncGenerator[EngineStep, None]:
    """One step for all the events that came since the last: an upstream faster than
    the gateway costs one pass down the pipeline per read, not one per event. A transport
    that hands out a chunk at a time is read ahead (`reads.coalesced`); one that hands out
    all it holds (`Upstream.reads_whole`) needs no task for it. Read to the body's end,
    past `[DONE]`: a response closed before its last chunk closes its connection too, and
    the next request would pay for a new one."""
    if response.headers.get("content-type", "").startswith("application/json"):
        # A server that answers `stream: true` with a whole answer (as for `stream: false`).
        whole = reader.feed_answer((await response.aread()).decode("utf-8", "replace"))
        if whole is not None:
            yield whole
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    # An async generator (httpx types it as an iterator): closing it ends the read.
    body = cast(AsyncGenerator[bytes, None], response.aiter_bytes())
    async with contextlib.aclosing(body if reads_whole else coalesced(body)) as pieces:
        async for piece in pieces:
            lines = (partial + decoder.decode(piece)).split("\n")
            partial = lines.pop()
            step = reader.feed_lines(lines)
            if step is not None:
                yield step
    step = reader.feed_lines([partial + decoder.decode(b"", final=True)])
    if step is not None:
        yield step


async def rest(exchange: Exchange, first: EngineStep) -> AsyncGenerator[EngineStep, None]:
    """The first step, then the rest; the exchange is ended however this ends."""
    upstream, reader, ticket = exchange.upstream, exchange.reader, exchange.ticket
    outcome = "cancelled"
    try:
        yield first
        if first.finished:
            outcome = "ok"
            upstream.breaker.success(ticket)
            return
        assert exchange.events is not None
        async for step in exchange.events:
            yield step
        if not reader.done and reader.usage is None:
            raise UpstreamStreamError({"message": "the stream ended before [DONE]"})
        outcome = "ok"
        upstream.breaker.success(ticket)
        yield reader.finish()
    except (httpx.TransportError, UpstreamStreamError, ValueError) as exc:
        outcome = "stream_error"
        upstream.breaker.failure(ticket)
        logger.info("upstream %s failed while answering: %r", upstream.label, exc)
        raise BadGatewayError(
            f"The upstream server failed while answering: {exc}",
            code="upstream_stream_error",
        ) from exc
    finally:
        if outcome == "cancelled":
            upstream.breaker.release(ticket)
        count(upstream.label, outcome)
        await end(exchange)
