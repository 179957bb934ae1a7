"""The stored form of a cached answer, and the entries it refuses."""

from __future__ import annotations

import json

import pytest

from sluicegate.cache.entry import CorruptEntryError, EntrySize, decode_entry, encode_entry
from sluicegate.engine.protocol import (
    ChoiceDelta,
    TokenLogprob,
)
from sluicegate.wire.completion import ChoiceState, Collector, Completion


def completion(logprobs: bool = False) -> Completion:
    choice = ChoiceState(0)
    for text in ("Hel", "lo", " world"):
        lps = [TokenLogprob(text, -0.5, (("a", -1.0),))] if logprobs else None
        choice.add(ChoiceDelta(0, text, 1, None, lps))
    choice.finish_reason = "stop"
    return Completion([choice], prompt_tokens=9)


@pytest.mark.parametrize("logprobs", [False, True])
def test_entry_round_trips_deltas_counts_and_logprobs(logprobs: bool) -> None:
    original = completion(logprobs)
    restored, created = decode_entry("k", encode_entry("k", original, 1234.5))
    assert created == 1234.5
    assert (
        restored.usage
        == original.usage
        == {
            "prompt_tokens": 9,
            "completion_tokens": 3,
            "total_tokens": 12,
        }
    )
    (choice,) = restored.choices
    assert choice.text_parts == ["Hel", "lo", " world"] and choice.finish_reason == "stop"
    assert [(d.text, d.logprobs) for d in choice.deltas()] == [
        (d.text, d.logprobs) for d in original.choices[0].deltas()
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b'{"version": 1}',
        b"[1, 2, 3]",
        b'{"version": 1, "key": "k", "created": 1, "prompt_tokens": -1, "choices": []}',
    ],
)
def test_undecodable_entries_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        decode_entry("k", data)


def test_entries_for_another_key_or_version_are_refused() -> None:
    data = encode_entry("k", completion(), 1.0)
    with pytest.raises(CorruptEntryError):
        decode_entry("other", data)
    with pytest.raises(CorruptEntryError):
        decode_entry("k", data.replace(b'"version":1', b'"version":2'))


def test_entry_round_trips_reasoning_aligned_with_the_parts() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "", 1, reasoning="Think."))
    collector.add(ChoiceDelta(0, "Paris", 1, reasoning="\n"))
    collector.add(ChoiceDelta(0, ".", 1, "stop", reasoning_tokens=2))
    completion = collector.completion(3)
    data = encode_entry("k", completion, 1.0)
    decoded, _ = decode_entry("k", data)
    replayed = list(decoded.deltas())
    assert [(d.text, d.reasoning) for d in replayed] == [
        ("", "Think."),
        ("Paris", "\n"),
        (".", ""),
        ("", ""),
    ]
    assert replayed[-1].reasoning_tokens == 2 and decoded.reasoning_tokens == 2
    assert decoded.usage["completion_tokens_details"] == {"reasoning_tokens": 2}
    size = EntrySize("k", 1)
    assert all(size.add(d) for d in collector.completion(3).deltas())
    assert size.bytes >= len(data)


def test_an_entry_whose_reasoning_misses_parts_is_refused() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "a", 1, reasoning="b"))
    collector.add(ChoiceDelta(0, "c", 1, "stop"))
    entry = json.loads(encode_entry("k", collector.completion(1), 1.0))
    entry["choices"][0]["reasoning"] = ["b"]
    with pytest.raises(CorruptEntryError, match="reasoning"):
        decode_entry("k", json.dumps(entry).encode())


def test_an_entry_without_reasoning_is_as_before() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "a", 1, "stop"))
    entry = json.loads(encode_entry("k", collector.completion(1), 1.0))
    assert not {"reasoning", "reasoning_tokens"} & set(entry["choices"][0])
