"""A profile as vLLM's own benchmark replays traces (`vllm bench serve --dataset-name
timed_trace`): one JSON line per request with `timestamp` (seconds), `input_length`,
`output_length` and `hash_ids` (the prefix blocks, `--timed-trace-chunk-hash-size` tokens
each), so that a recommendation can be checked with vLLM's tool."""

from __future__ import annotations

import json
from pathlib import Path

from sluicegate.tuning.profile import Profile


def write_timed_trace(profile: Profile, path: Path) -> None:
    """vLLM builds a prompt from its `hash_ids` alone: a request whose blocks do not cover
    its input gets blocks of its own (numbers no other request has) for the rest; an answer
    of no tokens asks for one (vLLM refuses `max_tokens` 0)."""
    start = profile.requests[0].t if profile.requests else 0.0
    fresh = max((b for r in profile.requests for b in r.blocks), default=0)
    lines = []
    for request in profile.requests:
        blocks = list(request.blocks)
        missing = -(-request.input_tokens // profile.block_size) - len(blocks)
        if missing > 0:
            blocks += range(fresh + 1, fresh + 1 + missing)
            fresh += missing
        line = {
            "timestamp": round(request.t - start, 6),
            "input_length": request.input_tokens,
            "output_length": max(1, request.output_tokens),
            "hash_ids": blocks,
        }
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def replay_command(path: Path, profile: Profile, base_url: str, model: str) -> str:
    """vLLM's command that replays the exported trace against a server."""
    return (
        f"vllm bench serve --base-url {base_url} --model {model} --backend openai "
        f"--endpoint /v1/completions --dataset-name timed_trace --dataset-path {path} "
        f"--timed-trace-chunk-hash-size {profile.block_size} "
        f"--num-prompts {len(profile.requests)}"
    )
