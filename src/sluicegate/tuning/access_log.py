"""A profile from the gateway's JSON access log (`SLUICEGATE_LOG_FORMAT=json`), for traffic
served before any capture was on.

Each access line of an inference request that reached the engine becomes a request: its
arrival is the line's time less the request's `total_ms` (the line is written when it ends),
its lengths the usage it reports (`prompt_tokens`, `completion_tokens`), its API the path.
What the log does not hold is filled in and said so in the header (`from: access-log`):
`max_tokens` is the output's length, every request is streamed at priority 0, no finish
reason is known, and no prefix sharing (no `blocks`: a tune then does not search prefix
caching). Cache hits, refusals and errors are left out (the engine never ran them), and so
are lines that are not the access log's (the rest of the gateway's log, vLLM's own lines).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sluicegate.observability.traffic_format import BLOCK_SIZE
from sluicegate.tuning.profile import Profile, Request

ACCESS_LOGGER = "sluicegate.access"
APIS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
ENGINE_CACHE = ("MISS", "BYPASS", None)


def profile_from_access_log(lines: Iterable[str], max_model_len: int) -> Profile:
    """The engine requests of an access log, in arrival order, from 0."""
    found: list[tuple[float, Request]] = []
    for line in lines:
        entry = _entry(line)
        if entry is None:
            continue
        method, _, path = str(entry.get("message", "")).partition(" ")
        api = APIS.get(path)
        prompt, completion = entry.get("prompt_tokens"), entry.get("completion_tokens")
        cache = entry.get("cache")
        if (
            method != "POST"
            or api is None
            or entry.get("status") != 200
            or cache not in ENGINE_CACHE
            or not isinstance(prompt, int)
            or not isinstance(completion, int)
            or prompt < 1
        ):
            continue
        total_ms = entry.get("total_ms")
        try:
            ended = datetime.fromisoformat(str(entry["time"])).timestamp()
        except (KeyError, ValueError):
            continue
        arrived = ended - (total_ms / 1000 if isinstance(total_ms, (int, float)) else 0.0)
        found.append(
            (
                arrived,
                Request(
                    t=0.0,
                    input_tokens=min(prompt, max_model_len - 1),
                    output_tokens=max(0, min(completion, max_model_len - prompt)),
                    max_tokens=max(1, min(completion, max_model_len - prompt)),
                    stream=True,
                    api=api,
                    priority=0,
                    cache=cache or "MISS",
                    finish_reason=None,
                ),
            )
        )
    found.sort(key=lambda item: item[0])
    origin = found[0][0] if found else 0.0
    requests = tuple(replace(request, t=round(arrived - origin, 4)) for arrived, request in found)
    header = {"max_model_len": max_model_len, "sample": 1.0, "from": "access-log"}
    return Profile(requests, BLOCK_SIZE, header)


def _entry(line: str) -> dict[str, object] | None:
    if '"sluicegate.access"' not in line:
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("logger") != ACCESS_LOGGER:
        return None
    return entry
