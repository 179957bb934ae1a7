"""Synthetic traffic profiles for a gateway with no capture yet: `chat` (conversations that
grow turn by turn over a few shared system prompts, streamed), `rag` (long prompts built on a
few shared documents) and `batch` (unstreamed, long answers, two priorities). Arrivals come in
bursts (15 s at 1.75 times the mean rate, 15 s at a quarter of it, each burst as high as the
others), as traffic does, so that the engine's knobs meet both a queue and a lull."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

from sluicegate.observability.traffic_format import BLOCK_SIZE
from sluicegate.tuning.profile import Profile, Request

PRESETS = ("chat", "rag", "batch")
BURST_SECONDS = 15.0


def make_preset(
    name: str,
    *,
    requests: int = 400,
    rate: float = 2.0,
    max_model_len: int = 2048,
    seed: int = 0,
) -> Profile:
    """`requests` of the preset `name`, arriving at `rate` a second on average (in bursts),
    each fitting `max_model_len`."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    if not rate > 0:
        raise ValueError(f"the rate must be above 0, not {rate}")
    rng = random.Random(seed)
    blocks = _Blocks()
    shape = {"chat": _chat, "rag": _rag, "batch": _batch}[name](rng, blocks, max_model_len)
    made: list[Request] = []
    for t, (prompt, out, stream, priority) in zip(_arrivals(rng, rate), shape, strict=False):
        if len(made) == requests:
            break
        out = min(out, max_model_len // 2)
        tokens = max(1, min(len(prompt) * BLOCK_SIZE, max_model_len - out))
        kept = prompt[: -(-tokens // BLOCK_SIZE)]
        made.append(
            Request(
                t=round(t, 4),
                input_tokens=tokens,
                output_tokens=out,
                max_tokens=out,
                stream=stream,
                api="chat",
                priority=priority,
                cache="MISS",
                finish_reason="length",
                blocks=tuple(kept),
            )
        )
    header = {"max_model_len": max_model_len, "preset": name, "seed": seed, "sample": 1.0}
    return Profile(tuple(made), BLOCK_SIZE, header)


class _Blocks:
    """New block numbers, 1 up."""

    def __init__(self) -> None:
        self._next = 1

    def new(self, count: int) -> list[int]:
        made = list(range(self._next, self._next + count))
        self._next += count
        return made


Shape = Iterator[tuple[list[int], int, bool, int]]
"""Each request's prompt blocks, output tokens, stream, priority."""


def _arrivals(rng: random.Random, rate: float) -> Iterator[float]:
    """Arrivals at 1.75x `rate` for 15 s, then 0.25x for 15 s, and so on (a mean of
    `rate`): each 15 s holds as many as its rate gives (within one, the fractions carried
    over), at times drawn at random within it. Every burst is as high as the others, so the
    held-out quarter's busiest seconds are as busy as the search part's: with Poisson
    counts, the busiest burst of three quarters is higher than the busiest of one, and a
    tune's gain found in the one could not show in the other."""
    expected = 0.0
    made = 0
    for period in itertools.count():
        start = period * BURST_SECONDS
        expected += rate * (1.75 if period % 2 == 0 else 0.25) * BURST_SECONDS
        count = int(expected) - made
        made += count
        yield from sorted(start + rng.uniform(0.0, BURST_SECONDS) for _ in range(count))


def _lognormal(rng: random.Random, median: float, spread: float, low: int, high: int) -> int:
    return max(low, min(high, int(rng.lognormvariate(math.log(median), spread))))


def _chat(rng: random.Random, blocks: _Blocks, window: int) -> Shape:
    systems = [blocks.new(_lognormal(rng, 8, 0.4, 2, 24)) for _ in range(3)]
    talks: list[list[int]] = []
    while True:
        if talks and rng.random() < 0.6:  # a conversation goes on: its prompt grows
            talk = rng.choice(talks)
            talk += blocks.new(_lognormal(rng, 3, 0.6, 1, 16))
            if len(talk) * BLOCK_SIZE > window // 2:
                talks.remove(talk)
        else:
            talk = list(rng.choice(systems)) + blocks.new(_lognormal(rng, 2, 0.6, 1, 12))
            talks = [*talks[-31:], talk]
        yield list(talk), _lognormal(rng, 96, 0.6, 8, 512), True, 0


def _rag(rng: random.Random, blocks: _Blocks, window: int) -> Shape:
    documents = [blocks.new(32) for _ in range(20)]
    while True:
        chosen = rng.sample(documents, k=min(len(documents), rng.randint(1, 3)))
        prompt = [b for document in chosen for b in document] + blocks.new(rng.randint(1, 4))
        yield prompt, _lognormal(rng, 128, 0.5, 16, 384), True, 0


def _batch(rng: random.Random, blocks: _Blocks, window: int) -> Shape:
    instructions = blocks.new(6)
    while True:
        prompt = instructions + blocks.new(_lognormal(rng, 24, 0.5, 2, 64))
        yield prompt, _lognormal(rng, 384, 0.4, 64, 1024), False, rng.choice((0, 5))
