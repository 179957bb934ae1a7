"""A profile exported as vLLM's timed trace is what vLLM's own benchmark replays: its
`TimedTrace` dataset reads it back with the same arrivals, lengths and shared prefixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluicegate.tuning.presets import make_preset
from sluicegate.tuning.trace_export import replay_command, write_timed_trace


class _Tokenizer:
    """Enough of a tokenizer for vLLM's dataset: a vocabulary and its special ids."""

    all_special_ids = (0, 1)

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(1000)}


def test_vllms_timed_trace_replays_the_export(tmp_path: Path) -> None:
    from vllm.benchmarks.datasets.datasets import TimedTrace

    profile = make_preset("rag", requests=50, seed=5)
    path = tmp_path / "trace.jsonl"
    write_timed_trace(profile, path)
    options: dict[str, Any] = {
        "timed_trace_chunk_hash_size": profile.block_size,
        "timed_trace_label_timestamp": "timestamp",
        "timed_trace_label_input_length": "input_length",
        "timed_trace_label_output_length": "output_length",
        "timed_trace_label_hash_ids": "hash_ids",
    }
    samples = TimedTrace(dataset_path=str(path), random_seed=0, **options).sample(
        _Tokenizer(), num_requests=50
    )
    assert [s.prompt_len for s in samples] == [r.input_tokens for r in profile.requests]
    assert [s.expected_output_len for s in samples] == [r.output_tokens for r in profile.requests]
    start = profile.requests[0].t
    assert [s.timestamp for s in samples] == [round(r.t - start, 6) for r in profile.requests]
    # Requests that share a document's blocks share those tokens in vLLM's prompts.
    first, other = (
        profile.requests[0],
        next(r for r in profile.requests[1:] if r.blocks[:32] == profile.requests[0].blocks[:32]),
    )
    index = profile.requests.index(other)
    shared = 32 * profile.block_size
    assert samples[0].prompt[:shared] == samples[index].prompt[:shared]
    assert "--dataset-name timed_trace" in replay_command(path, profile, "http://h", "m")
    assert first.blocks


def test_requests_whose_blocks_do_not_cover_them_get_blocks_of_their_own(tmp_path: Path) -> None:
    """vLLM builds a prompt from its blocks alone: a request with too few (a profile from the
    access log has none) gets fresh ones, shared with no other; no answer asks for none."""
    import json

    from sluicegate.tuning.profile import Profile, Request

    bare = Request(0.0, 40, 0, 8, True, "chat", 0, "MISS", None, ())
    covered = Request(1.0, 20, 4, 8, True, "chat", 0, "MISS", "stop", (1, 2))
    path = tmp_path / "trace.jsonl"
    write_timed_trace(Profile((bare, covered)), path)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["hash_ids"] == [3, 4, 5] and second["hash_ids"] == [1, 2]
    assert first["output_length"] == 1
