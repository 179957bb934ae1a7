"""The traffic capture (`TRAFFIC_CAPTURE`): a traffic profile (`observability.traffic_format`)
recorded from the requests the gateway serves, for `sluicegate tune` (docs/tuning.md).

A line per engine sequence (a request with `n` choices or several prompts makes one for each,
as vLLM runs them: what the replay sends), in arrival order: its arrival, exact input tokens
(after the template and the budget), output tokens, `max_tokens`, stream or not, API, the
priority the client asked for, cache result, finish reason (null: it did not finish: refused
or failed after the cache lookup, or its client left), and its prefix as numbered blocks
(`observability.prefix_blocks`). Never text, token ids, request or key ids, or addresses.

Not captured: cache hits and the requests that followed an identical one in flight (no
engine work of their own), requests refused before the cache lookup (their key's limits, a
bad body, an unknown model, the middleware's refusals) and the other APIs (embeddings...).

On the request path it costs a few attribute writes and two deque appends per request (none
when off: `AppState.capture` is None); the writer thread does the rest
(`observability.capture_writer`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, BinaryIO

from sluicegate.observability.capture_writer import LINES, CaptureWriter
from sluicegate.observability.prefix_blocks import PrefixBlocks
from sluicegate.observability.record import RequestRecord
from sluicegate.observability.traffic_entry import TrafficEntry
from sluicegate.observability.traffic_format import BLOCK_SIZE, FORMAT, FORMAT_VERSION
from sluicegate.paths import MESSAGES_PATH

CAPTURED_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    MESSAGES_PATH: "messages",
    "/v1/responses": "responses",
}
"""The paths captured, and the profile's `api` for each."""


class TrafficCapture:
    """Use `open`; then `arrived` and `ended` for each request (`TelemetryMiddleware`), and
    `close` once (the lifespan)."""

    def __init__(
        self, writer: CaptureWriter, sample: float, draw: Callable[[], float] = random.random
    ) -> None:
        self._writer = writer
        self._sample = sample
        self._draw = draw

    @classmethod
    def open(
        cls,
        file: BinaryIO,
        *,
        sample: float,
        max_bytes: int,
        max_model_len: int | None,
        blocks: PrefixBlocks | None = None,
        **writer: Any,
    ) -> TrafficCapture:
        """A capture writing to `file` (its header at once): each request taken with the
        probability `sample`, up to `max_bytes` in all."""
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "block_size": BLOCK_SIZE,
            "sample": sample,
        }
        if max_model_len is not None:
            header["max_model_len"] = max_model_len
        capture_writer = CaptureWriter(
            file, blocks or PrefixBlocks(), max_bytes, max_model_len, **writer
        )
        capture_writer.start(header)
        return cls(capture_writer, sample)

    @property
    def keyed(self) -> bool:
        """Whether the capture holds its hashing key (until `close`)."""
        return self._writer.keyed

    def arrived(self, record: RequestRecord, path: str) -> None:
        """A request arrived: on a captured path, it gets its `record.traffic`."""
        api = CAPTURED_PATHS.get(path)
        if api is None:
            return
        entry = TrafficEntry(api, record.started, self._sample >= 1 or self._draw() < self._sample)
        if entry.sampled:
            entry.kept = self._writer.opened(entry)
        record.traffic = entry

    def ended(self, record: RequestRecord) -> None:
        """The request's response has ended, however it ended."""
        entry = record.traffic
        if entry is None:
            return
        entry.ended = True
        if entry.kept:
            self._writer.ended(entry)
        elif entry.cache is not None:
            LINES["dropped" if entry.sampled else "sampled_out"].inc(entry.sequences)

    async def close(self) -> None:
        """Write what is held, close the file and forget the key."""
        self._writer.closing()
        await asyncio.to_thread(self._writer.join)
