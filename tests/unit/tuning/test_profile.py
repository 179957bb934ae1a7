"""A traffic profile read and checked: every refusal names its line (from 1, the header
included) and its field, before anything starts; the time split holds the last quarter out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.tuning.profile import MIN_REQUESTS, ProfileError, parse_profile, split_in_time

HEADER = {"format": "sluicegate-traffic", "version": 1, "block_size": 16}


def request(t: float, **fields: Any) -> dict[str, Any]:
    return {
        "t": t,
        "input_tokens": 40,
        "output_tokens": 8,
        "max_tokens": 8,
        "stream": True,
        "api": "chat",
        "priority": 0,
        "cache": "MISS",
        "finish_reason": "stop",
        "blocks": [1, 2, 3],
        **fields,
    }


def lines(*requests: dict[str, Any], header: dict[str, Any] = HEADER) -> list[str]:
    body = list(requests) or [request(i * 0.5) for i in range(MIN_REQUESTS)]
    return [json.dumps(header), *(json.dumps(r) for r in body)]


def many(**changed_at_10: Any) -> list[str]:
    """MIN_REQUESTS requests, the 10th (line 11) with `changed_at_10`."""
    made = [request(i * 0.5) for i in range(MIN_REQUESTS)]
    made[9] = {**made[9], **changed_at_10}
    return lines(*made)


def refusal(text: list[str], max_model_len: int | None = None) -> ProfileError:
    with pytest.raises(ProfileError) as refused:
        parse_profile(text, max_model_len)
    return refused.value


def test_a_good_profile_reads_whole() -> None:
    profile = parse_profile(lines())
    assert len(profile.requests) == MIN_REQUESTS and profile.span == (MIN_REQUESTS - 1) * 0.5
    assert profile.shares_prefixes() and not profile.has_priorities()


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ([], 1, "format"),
        (["not json"], 1, "json"),
        ([json.dumps({**HEADER, "format": "other"})], 1, "format"),
        ([json.dumps({**HEADER, "version": 9})], 1, "version"),
        (many(input_tokens="40"), 11, "input_tokens"),
        (many(stream=1), 11, "stream"),
        (many(priority=True), 11, "priority"),
        (many(api="embeddings"), 11, "api"),
        (many(cache="HIT"), 11, "cache"),
        (many(blocks=[1, 0]), 11, "blocks"),
        (many(blocks=[1, 2, 3, 4]), 11, "blocks"),
        (many(t=-1), 11, "t"),
        (many(t=0.1), 11, "t"),  # before the 9th request's 4.0 s: time goes backwards
    ],
)
def test_a_bad_line_is_named_with_its_field(text: list[str], line: int, field: str) -> None:
    refused = refusal(text)
    assert (refused.line, refused.field) == (line, field), str(refused)
    assert str(refused).startswith(f"line {line}: {field}: ")


def test_a_missing_field_is_named() -> None:
    made = many()
    broken = json.loads(made[10])
    del broken["finish_reason"]
    made[10] = json.dumps(broken)
    refused = refusal(made)
    assert (refused.line, refused.field) == (11, "finish_reason")
    assert "missing" in str(refused)


def test_a_request_longer_than_the_window_is_refused() -> None:
    refused = refusal(many(input_tokens=4000), max_model_len=2048)
    assert (refused.line, refused.field) == (11, "input_tokens")
    assert "2048" in str(refused)
    # The header's window when none is given.
    header = {**HEADER, "max_model_len": 1024}
    made = lines(*[request(i, input_tokens=1020) for i in range(MIN_REQUESTS)], header=header)
    assert refusal(made).line == 2


def test_too_few_requests_are_refused_at_the_last_line() -> None:
    refused = refusal(lines(*[request(i) for i in range(MIN_REQUESTS - 1)]))
    assert (refused.line, refused.field) == (MIN_REQUESTS, "requests")


def test_the_split_holds_out_the_last_quarter_of_the_time(tmp_path: Path) -> None:
    profile = parse_profile(lines(*[request(i * 1.0) for i in range(400)]))
    search, confirm = split_in_time(profile)
    assert len(search.requests) == 300 and len(confirm.requests) == 100
    assert search.requests[0].t == 0 and confirm.requests[0].t == 0
    # Written and read back, the profile is the same.
    path = tmp_path / "profile.jsonl"
    profile.write(path)
    assert parse_profile(path.read_text().splitlines()).requests == profile.requests


def test_numbers_that_say_nothing_are_refused() -> None:
    """NaN and infinite times (JSON as Python reads it allows them), an answer longer than
    it was allowed, a window that is no whole number."""
    made = many()
    made[10] = made[10].replace('"t": 4.5', '"t": NaN')
    assert (refusal(made).line, refusal(made).field) == (11, "t")
    refused = refusal(many(output_tokens=50))
    assert (refused.line, refused.field) == (11, "output_tokens")
    header = {**HEADER, "max_model_len": "big"}
    assert refusal(lines(header=header)).field == "max_model_len"
    assert parse_profile(lines(header={**HEADER, "max_model_len": 2048.0})).requests


def test_a_profile_that_arrives_all_at_once_cannot_be_split() -> None:
    profile = parse_profile(lines(*[request(1.0) for _ in range(MIN_REQUESTS)]))
    with pytest.raises(ValueError, match="at once"):
        split_in_time(profile)
