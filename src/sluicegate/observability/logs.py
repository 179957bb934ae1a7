"""Log output: plain lines or one JSON object per line (`log_format`).

A record may carry structured fields (`logger.info(msg, extra={"fields": {...}})`): the plain
format appends them as `key=value`, the JSON format as keys of the object. The access log
(`http.telemetry`) is the main user.

One record is one line, whatever a request put into it: the plain format writes every
non-printable character of a line (control characters, DEL, Unicode line breaks, lone
surrogates, ...) as its Python escape (`\\n`, `\\x1b`, `\\u2028`), so a path holding `%0A`
cannot forge a line; the JSON format escapes them as JSON does. A traceback keeps its own
lines below the record's.

Records wait for the writer thread in a bounded buffer; when it is full the oldest go, and
how many is counted (`dropped_records()`, exported as `sluicegate_log_records_dropped_total`)
and said in the log once the writer catches up.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LogFormat = Literal["plain", "json"]
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = "fields"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, dict) else {}


_LOGGING_STARTED: float = getattr(logging, "_startTime", time.time())
_LEAN: dict[str, Any] = {
    "pathname": __file__,
    "filename": "logs.py",
    "module": "logs",
    "lineno": 0,
    "funcName": None,
    "exc_info": None,
    "exc_text": None,
    "stack_info": None,
    "thread": None,
    "threadName": None,
    "processName": None,
    "process": None,
    "taskName": None,
}


def lean_record(
    name: str, level: int, msg: str, args: tuple[Any, ...], fields: dict[str, Any]
) -> logging.LogRecord:
    """A record with `fields`, made without `LogRecord.__init__`'s lookups per record (the
    caller's file, thread and process names), which no access line shows. It has every
    attribute a formatter reads, so any handler can take it."""
    record = logging.LogRecord.__new__(logging.LogRecord)
    now = time.time()
    record.__dict__.update(_LEAN)
    record.name = name
    record.msg = msg
    record.args = args
    record.levelno = level
    record.levelname = logging.getLevelName(level)
    record.created = now
    record.msecs = int((now - int(now)) * 1000)
    record.relativeCreated = (now - _LOGGING_STARTED) * 1000
    record.fields = fields
    return record


def escape(text: str) -> str:
    """`text` with each non-printable character written as its Python escape.

    `isprintable` runs at C speed, so a clean line (nearly all of them) costs one scan."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _escape_lines(text: str) -> str:
    return "\n".join(escape(line) for line in text.split("\n"))


class PlainFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        # One of several workers names itself on every line (`SLUICEGATE_WORKERS`).
        head = (
            PLAIN_FORMAT
            if worker is None
            else PLAIN_FORMAT.replace(" %(name)s", f" worker-{worker} %(name)s")
        )
        super().__init__(head)
        self._second = -1
        self._second_text = ""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The whole line, not only the arguments: any logger's message (uvicorn's, a library's)
        # may carry a path or other text a request chose.
        return escape(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _escape_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _escape_lines(super().formatStack(stack_info))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        # Lines come in bursts within one second: its text is made once (by the one writer
        # thread that formats).
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime(
                self.default_time_format, self.converter(record.created)
            )
        return f"{self._second_text},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        # Escaping is per character, so the joined pairs are escaped in one scan.
        pairs = escape(" ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items()))
        head, sep, rest = line.partition("\n")  # a traceback stays below the fields
        return f"{head} {pairs}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self._worker = {} if worker is None else {"worker": worker}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            **self._worker,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure_logging(
    level: str, log_format: LogFormat = "plain", worker: int | None = None
) -> None:
    """Send the process's logs (ours and uvicorn's) to stderr in `log_format`; a `worker`'s
    lines say which it is.

    Records are collected as they are and written by one thread, every `FLUSH_INTERVAL`, in
    one write. So a slow or full stderr (a pipe nobody drains) never blocks the event loop,
    and a busy gateway pays neither formatting nor a thread wake-up per line on the loop:
    waking a thread per access line costs more than the line."""
    formatter = JsonFormatter(worker) if log_format == "json" else PlainFormatter(worker)
    writer = _BatchWriter(formatter, sys.stderr)
    writer.start()
    atexit.register(writer.stop)
    logging.basicConfig(level=level.upper(), handlers=[_CollectingHandler(writer)], force=True)
    # httpx logs every upstream request at INFO: the access line already says what matters.
    for quiet in ("httpx", "httpcore"):
        logging.getLogger(quiet).setLevel(max(logging.WARNING, logging.getLogger().level))


FLUSH_INTERVAL = 0.01
"""Seconds between the writer's batches. Formatting a batch holds the GIL, which the event
loop's thread then waits for: a batch of 10 ms of a busy gateway's lines (~70 at 7,000
requests/s) takes under a millisecond, where one of 50 ms put 3 to 4 ms on the requests
being served (a cache hit's P99 at concurrency 32 went from 11.0 to 8.0 ms)."""
MAX_BUFFERED_RECORDS = 10_000
"""Records waiting for the writer: about 3 MB of access lines, 0.2 s of a very busy gateway's
logging; more means stderr is stuck, and then the oldest go."""


@dataclass(slots=True)
class DropCount:
    total: int = 0


_DROPPED = DropCount()


def dropped_records() -> int:
    """Records dropped by every writer of this process because its buffer was full."""
    return _DROPPED.total


class _BatchWriter:
    def __init__(
        self, formatter: logging.Formatter, stream: TextIO, max_records: int = MAX_BUFFERED_RECORDS
    ) -> None:
        self.records: deque[logging.LogRecord] = deque(maxlen=max_records)
        self.dropped = 0
        self._told = 0
        """How many of the drops the log has already been told about."""
        self._formatter = formatter
        self._stream = stream
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)

    def add(self, record: logging.LogRecord) -> None:
        """Buffer `record`; when the buffer is full the deque drops the oldest."""
        records = self.records
        # The writer may pop between the check and the append: then a drop is counted that
        # did not happen, never the other way round.
        if len(records) == records.maxlen:
            self.dropped += 1
            _DROPPED.total += 1
        records.append(record)

    def _run(self) -> None:
        while not self._stopping.wait(FLUSH_INTERVAL):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        lines: list[str] = []
        dropped = self.dropped
        if dropped > self._told:
            # The oldest records went: the notice comes before those that are left.
            lines.append(self._formatter.format(_drop_notice(dropped - self._told)))
            self._told = dropped
        records = self.records
        while records:
            record = records.popleft()
            try:
                lines.append(self._formatter.format(record))
            except Exception:  # a broken record must not end logging
                lines.append(f"unformattable log record from {record.name}: {record.msg!r}")
        if not lines:
            return
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing left to tell
            pass


def _drop_notice(count: int) -> logging.LogRecord:
    notice = logging.LogRecord(
        "sluicegate.logs",
        logging.WARNING,
        __file__,
        0,
        "%d log records dropped: the log writer fell behind (stderr slow or blocked)",
        (count,),
        None,
    )
    notice.fields = {"dropped": count}
    return notice


class _CollectingHandler(logging.Handler):
    """Hands records to the writer as they are: formatting happens in its thread."""

    def __init__(self, writer: _BatchWriter) -> None:
        super().__init__()
        self._add = writer.add

    def emit(self, record: logging.LogRecord) -> None:
        self._add(record)
