"""The traffic profile's format: a JSON line per engine request, what `sluicegate tune`
replays (docs/tuning.md). Never text, token ids, keys or addresses: lengths, times, and the
shape of prefix sharing as numbered blocks.

The first line is the header (`{"format": "sluicegate-traffic", "version": 1, "block_size":
16, ...}`); each other line one request, in arrival order."""

from __future__ import annotations

FORMAT = "sluicegate-traffic"
FORMAT_VERSION = 1
BLOCK_SIZE = 16
"""Tokens a prefix block holds (vLLM's timed traces' default chunk, and the GPU KV block)."""
APIS = ("chat", "completions", "messages", "responses")
CACHE_RESULTS = ("MISS", "BYPASS")
"""A request that reached the engine was not answered from the cache."""

FIELDS: dict[str, tuple[type, ...]] = {
    "t": (int, float),
    "input_tokens": (int,),
    "output_tokens": (int,),
    "max_tokens": (int,),
    "stream": (bool,),
    "api": (str,),
    "priority": (int,),
    "cache": (str,),
    "finish_reason": (str, type(None)),
    "blocks": (list,),
}
"""Each request's fields and their JSON types: `t` (seconds from the first request's arrival),
`input_tokens` (after the template), `output_tokens`, `max_tokens`, `stream`, `api`,
`priority` (the rank the client asked for), `cache`, `finish_reason` (None: the request did
not finish), `blocks` (the prefix's blocks, each a number: equal numbers, equal blocks)."""
