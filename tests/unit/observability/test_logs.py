"""Log output: one record is one line whatever a request puts in it, and the buffer between
the event loop and the writer thread is bounded, with what it drops counted."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
from prometheus_client import REGISTRY

import sluicegate.observability.metrics  # noqa: F401 (declares the dropped-records counter)
from sluicegate.observability import logs
from sluicegate.observability.logs import JsonFormatter, PlainFormatter

# What a request can put into a logged path (`%0A`, `%1B`, ... are decoded into the ASGI
# path) or a field: a forged line, a terminal escape, DEL, C1 and Unicode line breaks, bidi
# overrides, a lone surrogate.
HOSTILE = (
    "/v1/models\n2026-01-01 00:00:00,000 INFO sluicegate.access: GET /forged status=200"
    "\r\x1b[31m\x00\x7f\x85\u2028\u2029\u202e\ud800\tend"
)
FORGED = "2026-01-01 00:00:00,000 INFO sluicegate.access"


def record(
    msg: str = "%s %s",
    args: tuple[object, ...] = ("GET", HOSTILE),
    name: str = "sluicegate.access",
    fields: dict[str, object] | None = None,
    exc_info: object = None,
) -> logging.LogRecord:
    made = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, exc_info)  # type: ignore[arg-type]
    if fields is not None:
        made.fields = fields
    return made


def test_plain_lines_escape_control_and_invisible_characters() -> None:
    line = PlainFormatter().format(record(fields={"model": "m\nx=1", "cache": None}))
    assert "\n" not in line and "\r" not in line
    assert line.isprintable(), line
    assert not line.partition(" GET ")[2].startswith(FORGED)
    for escaped in ("\\n2026", "\\r", "\\x1b[31m", "\\x00", "\\x7f", "\\x85", "\\u2028"):
        assert escaped in line
    for escaped in ("\\u2029", "\\u202e", "\\ud800", "\\tend", "model=m\\nx=1", "cache=-"):
        assert escaped in line
    line.encode("utf-8")  # a lone surrogate would make the whole batch unwritable


def test_printable_text_is_left_alone() -> None:
    line = PlainFormatter().format(record(args=("GET", "/v1/modèles/字 ok"), fields={"a": "é"}))
    assert line.endswith("GET /v1/modèles/字 ok a=é")


def test_uvicorn_lines_with_a_path_are_escaped_too() -> None:
    made = record(
        msg='%s - "%s %s HTTP/%s" %d',
        args=("127.0.0.1:5000", "GET", HOSTILE, "1.1", 404),
        name="uvicorn.access",
    )
    line = PlainFormatter().format(made)
    assert "\n" not in line and line.isprintable()
    assert 'uvicorn.access: 127.0.0.1:5000 - "GET /v1/models\\n2026' in line


def test_a_traceback_stays_below_the_escaped_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    text = PlainFormatter().format(record(fields={"status": 500}, exc_info=exc_info))
    head, _, tail = text.partition("\n")
    assert head.endswith("status=500") and "\\n2026" in head
    assert tail.startswith("Traceback") and tail.endswith("ValueError: boom")


def test_json_lines_stay_valid_json_on_one_line() -> None:
    line = JsonFormatter().format(record(fields={"model": 'm\n{"x": 1}'}))
    assert "\n" not in line and "\r" not in line and "\u2028" not in line
    entry = json.loads(line)
    assert entry["message"] == "GET " + HOSTILE
    assert entry["model"] == 'm\n{"x": 1}'
    line.encode("utf-8")


def written(writer: logs._BatchWriter, stream: io.StringIO) -> list[str]:
    writer._flush()
    return stream.getvalue().splitlines()


def test_a_record_with_a_lone_surrogate_does_not_lose_the_batch() -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    writer = logs._BatchWriter(PlainFormatter(), stream)
    handler = logs._CollectingHandler(writer)
    for path in ("/a", "/b\ud800", "/c"):
        handler.emit(record(args=("GET", path)))
    writer._flush()
    lines = raw.getvalue().decode().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["/a", "/b\\ud800", "/c"]


def dropped_metric() -> float:
    value = REGISTRY.get_sample_value("sluicegate_log_records_dropped_total")
    assert value is not None, "sluicegate_log_records_dropped_total is not exported"
    return value


def test_the_buffer_is_bounded_and_counts_what_it_drops() -> None:
    assert logs.MAX_BUFFERED_RECORDS == 10_000
    stream = io.StringIO()
    writer = logs._BatchWriter(PlainFormatter(), stream, max_records=5)
    handler = logs._CollectingHandler(writer)
    before = dropped_metric()
    # The writer thread is not started: nothing drains the buffer, as with a stuck stderr.
    for i in range(12):
        handler.emit(record(args=("GET", f"/r{i}")))
    assert len(writer.records) == 5
    assert writer.dropped == 7
    assert dropped_metric() - before == 7
    lines = written(writer, stream)
    # The newest records are kept, and the gap is said where it happened.
    assert "7 log records dropped" in lines[0]
    assert [line.rsplit(" ", 1)[1] for line in lines[1:]] == [f"/r{i}" for i in range(7, 12)]
    handler.emit(record(args=("GET", "/after")))
    assert written(writer, stream)[-1].endswith("/after")
    assert writer.dropped == 7


@pytest.mark.parametrize("formatter", [PlainFormatter(), JsonFormatter()])
def test_the_drop_notice_has_the_log_format(formatter: logging.Formatter) -> None:
    stream = io.StringIO()
    writer = logs._BatchWriter(formatter, stream, max_records=1)
    handler = logs._CollectingHandler(writer)
    for i in range(3):
        handler.emit(record(args=("GET", f"/r{i}")))
    notice = written(writer, stream)[0]
    if isinstance(formatter, JsonFormatter):
        entry = json.loads(notice)
        assert entry["level"] == "WARNING" and entry["dropped"] == 2
    else:
        assert " WARNING sluicegate.logs: " in notice and notice.endswith("dropped=2")


def test_a_lean_record_formats_as_a_full_one_in_every_format() -> None:
    fields = {"status": 200, "cache": "HIT", "model": None}
    lean = logs.lean_record("sluicegate.access", logging.INFO, "%s %s", ("GET", "/x"), fields)
    full = record(args=("GET", "/x"), fields=fields)
    full.created, full.msecs = lean.created, lean.msecs
    assert PlainFormatter().format(lean) == PlainFormatter().format(full)
    assert json.loads(JsonFormatter().format(lean)) == json.loads(JsonFormatter().format(full))
    # Any other handler's formatter (pytest's, a user's) finds every attribute it may name.
    every = " ".join(f"%({name})s" for name in vars(full) if name != "fields")
    assert logging.Formatter(every).format(lean)


def test_plain_times_keep_their_milliseconds_across_lines_of_one_second() -> None:
    formatter = PlainFormatter()
    reference = logging.Formatter(logs.PLAIN_FORMAT)
    for created in (1_800_000_000.004, 1_800_000_000.5, 1_800_000_000.999, 1_800_000_001.25):
        made = record(args=("GET", "/x"))
        made.created, made.msecs = created, int(round((created - int(created)) * 1000, 3))
        assert formatter.formatTime(made) == reference.formatTime(made)
