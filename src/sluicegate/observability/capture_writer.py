"""The traffic capture's writer: a daemon thread that puts requests back in arrival order,
hashes their prompts into block numbers and writes their lines (`observability.capture`).

The event loop only appends to a deque: each captured arrival as it comes, each end as it
comes (`opened`, `ended`). The thread drains it every `FLUSH_INTERVAL`: an end's prompts are
hashed at once (`PrefixBlocks.digests`, so their ids are let go), and requests leave in the
order they arrived, each once every request that arrived before it has ended. One that stays
open while `MAX_HELD` requests wait behind it is given up (its line would come out of order:
it is dropped when it ends), so that what a request left open holds back stays bounded.
Past `max_bytes`, nothing more is written, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, BinaryIO

import orjson

from sluicegate.observability.metrics import TRAFFIC_CAPTURE_LINES, TRAFFIC_CAPTURE_OUTCOMES
from sluicegate.observability.prefix_blocks import PrefixBlocks
from sluicegate.observability.traffic_entry import TrafficEntry
from sluicegate.observability.traffic_format import BLOCK_SIZE

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 0.1
"""Seconds between the writer's batches: a line waits at most this long once it may go."""
MAX_PENDING = 20_000
"""Arrivals and ends waiting for the thread; an arrival past them is not captured (the
thread is stuck on a slow disk)."""
MAX_HELD = 10_000
"""Requests waiting, in arrival order, for an earlier one still open."""

LINES = {outcome: TRAFFIC_CAPTURE_LINES.labels(outcome) for outcome in TRAFFIC_CAPTURE_OUTCOMES}


class CaptureWriter:
    def __init__(
        self,
        file: BinaryIO,
        blocks: PrefixBlocks,
        max_bytes: int,
        max_model_len: int | None = None,
        *,
        interval: float = FLUSH_INTERVAL,
        max_held: int = MAX_HELD,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._file = file
        self._blocks = blocks
        self._max_bytes = max_bytes
        self._window = max_model_len
        self._interval = interval
        self._max_held = max_held
        self._max_pending = max_pending
        self._events: deque[tuple[bool, TrafficEntry]] = deque()
        self._closing = False
        # The thread's own:
        self._order: deque[TrafficEntry] = deque()
        self._held = 0
        """Requests of `_order` that have ended."""
        self._origin: float | None = None
        self._bytes = 0
        self._full = False
        self._broken = False
        self._batch: list[bytes] = []
        self._counts = dict.fromkeys(TRAFFIC_CAPTURE_OUTCOMES, 0)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic-capture", daemon=True)

    def start(self, header: dict[str, Any]) -> None:
        """Write the header (before any request: on the loop, at start-up) and start."""
        line = orjson.dumps(header) + b"\n"
        self._file.write(line)
        self._file.flush()
        self._bytes = len(line)
        self._thread.start()

    @property
    def keyed(self) -> bool:
        """Whether the capture still holds its hashing key (until it has closed)."""
        return self._blocks.keyed

    # ---- the event loop's side -------------------------------------------------------------

    def opened(self, entry: TrafficEntry) -> bool:
        """A captured request arrived; False when the writer cannot take it."""
        if self._closing or len(self._events) >= self._max_pending:
            return False
        self._events.append((True, entry))
        return True

    def ended(self, entry: TrafficEntry) -> None:
        """A request `opened` has ended."""
        if self._closing:
            if entry.cache is not None:
                LINES["dropped"].inc(entry.sequences)
            return
        self._events.append((False, entry))

    def closing(self) -> None:
        """Take nothing more (on the event loop: whatever came before is written)."""
        self._closing = True
        self._stopping.set()

    def join(self) -> None:
        """Wait until what may be written is, what is still open given up, the file closed
        and the key forgotten. Blocks: call it off the event loop (`asyncio.to_thread`)."""
        self._thread.join()

    # ---- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.wait(self._interval):
                self._drain()
            self._drain(final=True)
        except Exception as exc:  # a capture must never take the gateway down
            # Named by its type only: its message could hold a value of the traffic.
            logger.error(
                "traffic capture: stopped by %s; nothing more is recorded", type(exc).__name__
            )
        finally:
            self._blocks.forget()
            with contextlib.suppress(OSError):
                self._file.close()

    def _drain(self, final: bool = False) -> None:
        events = self._events
        while events:
            opens, entry = events.popleft()
            if opens:
                self._order.append(entry)
            else:
                self._end(entry)
            self._release()
        self._release(final)
        self._flush()

    def _end(self, entry: TrafficEntry) -> None:
        if entry.given_up:
            if entry.cache is not None:
                self._counts["dropped"] += entry.sequences
            return
        if entry.cache is None:
            entry.digests = []
        else:
            entry.digests = [self._digests(ids) for ids in entry.prompts]
        entry.prompts = ()  # the ids go with the run
        self._held += 1

    def _digests(self, ids: Sequence[int]) -> list[bytes]:
        try:
            return self._blocks.digests(ids)
        except (OverflowError, TypeError):  # an id no vocabulary has: no blocks, no failure
            return []

    def _release(self, final: bool = False) -> None:
        """Every request at the front of the arrival order that has ended, in order."""
        order = self._order
        while order:
            front = order[0]
            if front.digests is None:
                if not final and self._held <= self._max_held:
                    return
                front.given_up = True
                order.popleft()
                continue
            order.popleft()
            self._held -= 1
            if front.cache is not None:
                self._write(front)
            front.digests = None

    def _write(self, entry: TrafficEntry) -> None:
        if self._origin is None:
            self._origin = entry.started
        t = round(entry.started - self._origin, 4)
        for prompt_index, digests in enumerate(entry.digests or ()):
            inputs = entry.input_tokens(prompt_index)
            blocks = self._blocks.numbers(digests)[: -(-inputs // BLOCK_SIZE)]
            for choice in range(entry.n):
                at = prompt_index * entry.n + choice
                if inputs < 1:  # no tokenizer here, and the engine never counted it
                    self._counts["dropped"] += 1
                    continue
                outputs = entry.tokens[at]
                self._line(
                    {
                        "t": t,
                        "input_tokens": inputs,
                        "output_tokens": outputs,
                        "max_tokens": self._max_tokens(entry, inputs, outputs),
                        "stream": entry.stream,
                        "api": entry.api,
                        "priority": entry.priority,
                        "cache": entry.cache,
                        "finish_reason": entry.reasons[at],
                        "blocks": blocks,
                    }
                )

    def _max_tokens(self, entry: TrafficEntry, inputs: int, outputs: int) -> int:
        """What the request allowed, within the window (a bound the gateway only reserved,
        an upstream deciding the length, may pass it), and never below what came."""
        allowed = entry.max_tokens
        if self._window is not None:
            allowed = min(allowed, self._window - inputs)
        return max(1, outputs, allowed)

    def _line(self, fields: dict[str, Any]) -> None:
        if self._broken:
            self._counts["dropped"] += 1
            return
        line = orjson.dumps(fields) + b"\n"
        if self._full or self._bytes + len(line) > self._max_bytes:
            if not self._full:
                self._full = True
                logger.warning(
                    "traffic capture: TRAFFIC_CAPTURE_MAX_BYTES (%d) reached; later requests "
                    "are not captured",
                    self._max_bytes,
                )
            self._counts["over_size"] += 1
            return
        self._batch.append(line)
        self._bytes += len(line)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch and not self._broken:
            try:
                self._file.write(b"".join(batch))
                self._file.flush()
                self._counts["written"] += len(batch)
            except OSError as exc:
                self._broken = True
                self._counts["dropped"] += len(batch)
                logger.warning("traffic capture: writing failed (%s); it stops here", exc)
        for outcome, count in self._counts.items():
            if count:
                LINES[outcome].inc(count)
                self._counts[outcome] = 0
