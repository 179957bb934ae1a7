"""The synthetic profiles: valid, bursty, each with the shape its name says."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import mean

import pytest

from sluicegate.tuning.presets import BURST_SECONDS, PRESETS, make_preset
from sluicegate.tuning.profile import read_profile


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_is_a_profile_that_can_be_tuned_on(name: str, tmp_path: Path) -> None:
    profile = make_preset(name, requests=300, rate=2.0, max_model_len=1024, seed=1)
    path = tmp_path / f"{name}.jsonl"
    profile.write(path)
    assert read_profile(path, max_model_len=1024).requests == profile.requests
    assert len(profile.requests) == 300
    assert make_preset(name, requests=300, seed=1, max_model_len=1024) == profile  # seeded
    assert make_preset(name, requests=300, seed=2, max_model_len=1024) != profile


def test_arrivals_come_in_bursts() -> None:
    profile = make_preset("chat", requests=600, rate=2.0, seed=3)
    busy = [r for r in profile.requests if int(r.t // BURST_SECONDS) % 2 == 0]
    quiet = [r for r in profile.requests if int(r.t // BURST_SECONDS) % 2 == 1]
    # 1.75x against 0.25x the mean rate, over equal times: 7 to 1.
    assert 6 * len(quiet) < len(busy) < 8 * len(quiet)
    with pytest.raises(ValueError, match="rate"):
        make_preset("chat", rate=0.0)


def test_every_burst_is_as_high_as_the_others() -> None:
    """So that the held-out quarter's busiest seconds are as busy as the search part's."""
    profile = make_preset("chat", requests=400, rate=1.1, seed=1)
    periods = Counter(int(r.t // BURST_SECONDS) for r in profile.requests)
    last = max(periods)
    bursts = [n for p, n in periods.items() if p % 2 == 0 and p != last]
    lulls = [n for p, n in periods.items() if p % 2 == 1 and p != last]
    assert max(bursts) - min(bursts) <= 1 and abs(mean(bursts) - 1.1 * 1.75 * 15) <= 1
    assert max(lulls) - min(lulls) <= 1
    times = [r.t for r in profile.requests]
    assert times == sorted(times) and len(set(times)) > 390


def test_the_shapes_differ_as_their_names_say() -> None:
    chat, rag, batch = (make_preset(n, requests=300, seed=4) for n in ("chat", "rag", "batch"))
    assert chat.shares_prefixes() and rag.shares_prefixes()
    assert all(r.stream for r in chat.requests) and not any(r.stream for r in batch.requests)
    assert batch.has_priorities() and not chat.has_priorities()
    assert mean(r.input_tokens for r in rag.requests) > 2 * mean(
        r.input_tokens for r in chat.requests
    )
    assert mean(r.output_tokens for r in batch.requests) > mean(
        r.output_tokens for r in chat.requests
    )
