"""The structured-outputs benchmark's pure parts (bench/structured_outputs.py): its schema,
reading a stream, the A-B-B-A order and the summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from structured_outputs import five_field_schema, order, read_stream, summary


def test_the_schema_has_five_required_fields_and_a_tag_makes_a_new_one() -> None:
    schema = five_field_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert len(schema["properties"]) == 5 and sorted(schema["required"]) == sorted(
        schema["properties"]
    )
    tagged = five_field_schema("ab12")
    assert set(tagged["properties"]).isdisjoint(schema["properties"])
    jsonschema.validate({"name": "x", "age": 3, "city": "Rome", "member": True, "score": 1}, schema)


def event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n"


def test_a_stream_reads_as_ttft_latency_tokens_and_text() -> None:
    lines = [
        event({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
        b"\n",
        event({"choices": [{"delta": {"content": '{"a":'}}]}),
        event({"choices": [{"delta": {"content": "1}"}}]}),
        event({"choices": [], "usage": {"completion_tokens": 4}}),
        b"data: [DONE]\n",
    ]
    stamps = [10.1, 10.1, 10.5, 10.7, 10.8, 10.9]
    reading = read_stream(lines, 10.0, stamps)
    assert reading.text == '{"a":1}'
    assert reading.tokens == 4
    assert abs(reading.ttft - 0.5) < 1e-9  # the first event with content, not the role
    assert abs(reading.latency - 0.9) < 1e-9


def test_an_error_event_fails_the_reading() -> None:
    try:
        read_stream([event({"error": {"message": "boom"}})], 0.0, [1.0])
    except RuntimeError as exc:
        assert "boom" in str(exc)
    else:
        raise AssertionError("an error event must not read as a response")


def test_rounds_alternate_a_b_b_a() -> None:
    assert [order(i) for i in range(4)] == [
        ("vllm", "sluicegate"),
        ("sluicegate", "vllm"),
        ("vllm", "sluicegate"),
        ("sluicegate", "vllm"),
    ]


def test_summary_takes_median_throughput_and_pooled_latencies() -> None:
    rounds = [
        {"req_per_s": 1.0, "tok_per_s": 10.0, "ttfts": [0.1, 0.3], "latencies": [1.0, 2.0],
         "tokens": [5, 7], "invalid": 0},
        {"req_per_s": 3.0, "tok_per_s": 30.0, "ttfts": [0.2], "latencies": [3.0],
         "tokens": [6], "invalid": 1},
    ]  # fmt: skip
    figures = summary(rounds)
    assert figures["req/s"] == 2.0 and figures["out tok/s"] == 20.0
    assert abs(figures["median TTFT ms"] - 200.0) < 1e-9
    assert figures["median latency ms"] == 2000.0
    assert figures["invalid JSON"] == 1.0
