"""Log output: plain lines or one JSON object per line (`log_format`).

A record may carry structured fields (`logger.info(msg, extra={"fields": {...}})`): the plain
format appends them as `key=value`, the JSON format as keys of the object. The access log
(`observability.middleware`) is the main user.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
from collections import deque
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LogFormat = Literal["plain", "json"]
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = "fields"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, dict) else {}


class PlainFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        pairs = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
        head, sep, rest = line.partition("\n")  # a traceback stays below the fields
        return f"{head} {pairs}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure_logging(level: str, log_format: LogFormat = "plain") -> None:
    """Send the process's logs (ours and uvicorn's) to stderr in `log_format`.

    Records are collected as they are and written by one thread, every `FLUSH_INTERVAL`, in
    one write. So a slow or full stderr (a pipe nobody drains) never blocks the event loop,
    and a busy gateway pays neither formatting nor a thread wake-up per line on the loop:
    waking a thread per access line costs more than the line."""
    formatter = JsonFormatter() if log_format == "json" else PlainFormatter()
    writer = _BatchWriter(formatter, sys.stderr)
    writer.start()
    atexit.register(writer.stop)
    logging.basicConfig(level=level.upper(), handlers=[_CollectingHandler(writer)], force=True)


FLUSH_INTERVAL = 0.05


class _BatchWriter:
    def __init__(self, formatter: logging.Formatter, stream: TextIO) -> None:
        self.records: deque[logging.LogRecord] = deque()
        self._formatter = formatter
        self._stream = stream
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stopping.wait(FLUSH_INTERVAL):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        lines: list[str] = []
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


class _CollectingHandler(logging.Handler):
    """Hands records to the writer as they are: formatting happens in its thread."""

    def __init__(self, writer: _BatchWriter) -> None:
        super().__init__()
        self._records = writer.records

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)
