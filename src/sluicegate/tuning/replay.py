"""A window of a profile replayed against a gateway, open loop: each request is sent at its
own time whatever the ones before are doing (traffic does not wait for the server), as a text
completion of the profile's token ids, streamed, its output held to the profile's length
(`ignore_eos`). Each comes back as an `Outcome`: when its first text came and the gaps between
the chunks that carry text (vLLM's benchmark times every chunk with choices; a chunk with none
says nothing of the engine's pace), or that it was refused (429, 503) or failed; one still
streaming when the replay ends is cut, and judged on what it had shown (`Outcome.cut`).
Every request is replayed streamed, an unstreamed one too: it is judged as its answer's
first token and pace would be. The caller gives each trial a prompt maker of its own salt,
so that no trial finds the one before's prompts in the prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from sluicegate.tuning.objective import Outcome
from sluicegate.tuning.profile import Request
from sluicegate.tuning.prompts import PromptMaker

REFUSED = (429, 503)
LATE = Outcome(None)
"""What a request still without its first token past the TTFT target is judged as: a miss."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    """The gateway's base URL (`http://127.0.0.1:8000`)."""
    model: str
    timeout: float = 300.0
    """Seconds a request may take in all: past them it failed."""
    send_priority: bool = False
    """Send each request's priority (only a gateway scheduling by priority takes it)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every request (the gateway's key)."""
    cut_at: float | None = None
    """Seconds from the replay's start past which every request still running is cut
    (`Outcome.cut`: judged on what it had shown): one end for the whole window, whenever
    each request was sent."""
    priority_offset: int = 0
    """Added to each priority sent (so that the lowest is 0: a gateway refuses negative
    ones from keys that are not an admin's)."""


class Stopped(Exception):
    """The replay was stopped by its watcher; `outcomes` are those that had come back."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__(f"stopped after {len(outcomes)} outcomes")
        self.outcomes = outcomes


async def replay(
    target: Target,
    requests: Sequence[Request],
    prompts: PromptMaker,
    keep_going: Callable[[Outcome], bool] | None = None,
    late_after: float | None = None,
) -> list[Outcome]:
    """Every request of `requests` (their `t` from 0), sent on time; their outcomes in order.
    `keep_going` judges each request once: by its outcome when it comes back or, with
    `late_after`, as `LATE` as soon as that many seconds pass without its first token (it has
    missed a TTFT target of that, whatever comes next). When it says no, what is still in
    flight is cancelled and `Stopped` raised with the outcomes so far (a trial that can no
    longer meet its objective need not run on)."""
    connector = aiohttp.TCPConnector(limit=0)
    done: list[Outcome] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def one(body: dict[str, object]) -> Outcome:
        judged = False

        def judge(outcome: Outcome) -> None:
            nonlocal judged
            if keep_going is not None and not judged:
                judged = True
                if not keep_going(outcome):
                    stop.set()

        late = None
        if keep_going is not None and late_after is not None:
            late = loop.call_later(late_after, judge, LATE)
        within, cut = target.timeout, False
        if target.cut_at is not None:
            left = target.cut_at - (time.perf_counter() - began)
            within, cut = min(within, left), left <= within
        try:
            outcome = await _one(session, target, body, late.cancel if late else None, within, cut)
        finally:
            if late is not None:
                late.cancel()
        done.append(outcome)
        judge(outcome)
        return outcome

    async with aiohttp.ClientSession(connector=connector, headers=dict(target.headers)) as session:
        began = time.perf_counter()
        tasks = []
        # A task group: a replay cancelled (a trial stopped early) cancels what it sent.
        async with asyncio.TaskGroup() as group:
            for index, request in enumerate(requests):
                delay = max(0.0, began + request.t - time.perf_counter())
                if await _stopped_within(stop, delay):
                    break
                body = _body(target, request, prompts.ids(request, index))
                tasks.append(group.create_task(one(body)))
            if not stop.is_set() and tasks:
                waiting = asyncio.gather(*tasks, return_exceptions=True)
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait((waiting, stopping), return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
            if stop.is_set():
                for task in tasks:
                    task.cancel()
        if stop.is_set():
            raise Stopped(list(done))
        return [task.result() for task in tasks]


async def _stopped_within(stop: asyncio.Event, delay: float) -> bool:
    """Waits `delay` seconds or until `stop` is set; whether it was."""
    if not stop.is_set() and delay > 0:
        try:
            async with asyncio.timeout(delay):
                await stop.wait()
        except TimeoutError:
            pass
    return stop.is_set()


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
        body["priority"] = request.priority + target.priority_offset
    return body


async def _one(
    session: aiohttp.ClientSession,
    target: Target,
    body: dict[str, object],
    on_first: Callable[[], None] | None = None,
    within: float | None = None,
    cut: bool = False,
) -> Outcome:
    """One request, streamed; `on_first` is called at its first text. Past `within` seconds
    (the target's timeout by default) it failed or, when `within` is the replay's end
    (`cut`), it is cut: judged on what it had shown (`Outcome.cut`)."""
    started = time.perf_counter()
    first: float | None = None
    last = started
    gaps: list[float] = []
    tokens = 0
    deadline = asyncio.timeout(max(0.0, target.timeout if within is None else within))
    try:
        async with (
            deadline,
            session.post(target.url + "/v1/completions", json=body) as response,
        ):
            if response.status != 200:
                await response.read()
                refused = response.status in REFUSED
                rejected = 400 <= response.status < 500 and not refused
                return Outcome(None, refused=refused, failed=not refused, rejected=rejected)
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
                    if on_first is not None:
                        on_first()
                else:
                    gaps.append(now - last)
                last = now
    except TimeoutError:
        if not (cut and deadline.expired()):  # too slow, or a timeout of aiohttp's own
            return Outcome(first, tuple(gaps), tokens, failed=True)
        if first is not None:
            # The gap it was in when cut is one too (at least this long), and its usage
            # never came: a chunk holds a token at least.
            gaps.append(time.perf_counter() - last)
            tokens = max(tokens, len(gaps))
        return Outcome(first, tuple(gaps), tokens, cut=True)
    except (aiohttp.ClientError, ValueError):
        # Not the stream it should be (a line past aiohttp's bound, a chunk
        # that is no JSON): the request failed, the trial goes on.
        return Outcome(first, tuple(gaps), tokens, failed=True)
    return Outcome(first, tuple(gaps), tokens)
