"""A window of a profile replayed against a gateway, open loop: each request is sent at its
own time whatever the ones before are doing (traffic does not wait for the server), as a text
completion of the profile's token ids, streamed, its output held to the profile's length
(`ignore_eos`). Each comes back as an `Outcome`: when its first text came and the gaps between
the chunks that carry text (vLLM's benchmark times every chunk with choices; a chunk with none
says nothing of the engine's pace), or that it was refused (429, 503) or failed. Every request
is replayed streamed, an unstreamed one too: it is judged as its answer's first token and
pace would be. The caller gives each trial a prompt maker of its own salt, so that no trial
finds the one before's prompts in the prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from sluicegate.tuning.objective import Outcome
from sluicegate.tuning.profile import Request
from sluicegate.tuning.prompts import PromptMaker

REFUSED = (429, 503)


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    """The gateway's base URL (`http://127.0.0.1:8000`)."""
    model: str
    timeout: float = 300.0
    """Seconds a request may take in all: past them it failed."""
    send_priority: bool = False
    """Send each request's priority (only a gateway scheduling by priority takes it)."""


async def replay(
    target: Target, requests: Sequence[Request], prompts: PromptMaker
) -> list[Outcome]:
    """Every request of `requests` (their `t` from 0), sent on time; their outcomes in order."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        tasks = []
        # A task group: a replay cancelled (a trial stopped early) cancels what it sent.
        async with asyncio.TaskGroup() as group:
            for index, request in enumerate(requests):
                await asyncio.sleep(max(0.0, began + request.t - time.perf_counter()))
                body = _body(target, request, prompts.ids(request, index))
                tasks.append(group.create_task(_one(session, target, body)))
        return [task.result() for task in tasks]


def _body(target: Target, request: Request, ids: list[int]) -> dict[str, object]:
    body: dict[str, object] = {
        "model": target.model,
        "prompt": ids,
        "max_tokens": request.output_tokens or 1,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.send_priority:
        body["priority"] = request.priority
    return body


async def _one(session: aiohttp.ClientSession, target: Target, body: dict[str, object]) -> Outcome:
    started = time.perf_counter()
    first: float | None = None
    last = started
    gaps: list[float] = []
    tokens = 0
    try:
        async with asyncio.timeout(target.timeout):
            async with session.post(target.url + "/v1/completions", json=body) as response:
                if response.status != 200:
                    await response.read()
                    refused = response.status in REFUSED
                    return Outcome(None, refused=refused, failed=not refused)
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Outcome(first, tuple(gaps), tokens, failed=True)
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"].get("completion_tokens") or tokens)
                    if not any(c.get("text") for c in chunk.get("choices") or ()):
                        continue
                    now = time.perf_counter()
                    if first is None:
                        first = now - started
                    else:
                        gaps.append(now - last)
                    last = now
    except (TimeoutError, aiohttp.ClientError, ValueError):
        # Too slow, cut, or not the stream it should be (a line past aiohttp's bound, a chunk
        # that is no JSON): the request failed, the trial goes on.
        return Outcome(first, tuple(gaps), tokens, failed=True)
    return Outcome(first, tuple(gaps), tokens)
