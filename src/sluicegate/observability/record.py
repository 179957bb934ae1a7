"""What one request's access line and timeline need, filled in by whoever learns it while
it is served.

`TelemetryMiddleware` opens a `RequestRecord` for each HTTP request and makes it current
(a context variable, so it follows the request into the tasks it starts); the service marks
when the request was prepared, the engine-run hook adds token counts and the engine's times,
and the middleware the first byte sent (`observability.timeline` makes phases of them). Code
with no current request (unit tests of the service, background work) gets None and records
nothing.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    started: float = field(default_factory=time.perf_counter)
    """`time.perf_counter()` when the request arrived."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token: float | None = None
    """`time.perf_counter()` when the engine produced the request's first token."""
    # The request's timeline (`observability.timeline`), each a `time.perf_counter()`.
    prepared: float | None = None
    handed: float | None = None
    queued: float | None = None
    scheduled: float | None = None
    engine_first_token: float | None = None
    first_byte: float | None = None

    def add_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens = (self.prompt_tokens or 0) + prompt_tokens
        self.completion_tokens = (self.completion_tokens or 0) + completion_tokens


def mark_prepared() -> None:
    """The current request's prompts are rendered, tokenized and fitted to the budget."""
    record = _current.get()
    if record is not None and record.prepared is None:
        record.prepared = time.perf_counter()


_current: ContextVar[RequestRecord | None] = ContextVar("sluicegate_request", default=None)


def current_request() -> RequestRecord | None:
    """The record of the request being served in this context, if any."""
    return _current.get()


def open_request(record: RequestRecord) -> Token[RequestRecord | None]:
    return _current.set(record)


def close_request(token: Token[RequestRecord | None]) -> None:
    _current.reset(token)
