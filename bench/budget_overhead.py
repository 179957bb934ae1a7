"""What the token budget adds to a chat request: counting plus trimming, and event-loop blocks.

A deterministic conversation (a system prompt, 50 user/assistant turns of prose, some with a
list or an indented code block, then a last question; about 4,000 tokens with the bundled
model's tokenizer; `--untidy` adds trailing spaces and blank-line runs everywhere) is fitted
by `TokenBudget.fit_chat`, with the real tokenizer and the gateway's defaults, into a context
window that forces trimming (2,048 by default). Each round also runs what a request cost
before the budget, one `encode_chat`; the difference is the added time, in wall time and in
CPU time (which other load on the host disturbs less).

The event loop is watched two ways: a task sleeping 1 ms at a time measures how late the loop
wakes it (host noise included: an idle pass gives the floor), and, on asyncio's own loop,
every callback is timed, in the loop thread's CPU time: the longest stretch the loop spends
in the gateway's own code.

    .venv/bin/python bench/budget_overhead.py
    .venv/bin/python bench/budget_overhead.py --untidy --rounds 500
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time

from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.inference.budget import BudgetPolicy, TokenBudget

_VOCABULARY = """
the a model token budget request context window reply user gateway engine prompt stream cache
latency server client message turn answer question system value field returns keeps drops
counts fits runs sends reads writes checks long short new old first last every each quickly
slowly exactly about under over into from with
"""
WORDS = _VOCABULARY.split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
    return " ".join(words).capitalize() + rng.choice(".!?.")


def message(rng: random.Random, role: str, sentences: int, untidy: bool) -> str:
    """Prose; a quarter of the replies end with an indented code block, some messages with a
    list. `untidy` adds what compression removes besides indentation: trailing spaces, runs
    of blank lines."""
    text = " ".join(sentence(rng) for _ in range(sentences))
    kind = rng.random()
    gap, end = ("\n\n\n", "  ") if untidy else ("\n\n", "")
    if role == "assistant" and kind < 0.25:
        body = "\n".join(f"    {rng.choice(WORDS)} = {rng.choice(WORDS)}({i})" for i in range(6))
        text += f"{gap}```python\ndef f():\n{body}\n    return None\n```"
    elif kind < 0.4:
        text += gap + "\n".join(f"- {sentence(rng)}{end}" for _ in range(3))
    return text


def conversation(
    turns: int, sentences: int, untidy: bool = False, seed: int = 7
) -> list[dict[str, str]]:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    for _ in range(turns):
        for role in ("user", "assistant"):
            messages.append({"role": role, "content": message(rng, role, sentences, untidy)})
    messages.append({"role": "user", "content": "So, what should I do next?"})
    return messages


async def sized_conversation(
    tokenizer: HFPromptTokenizer, turns: int, tokens: int, untidy: bool
) -> list[dict[str, str]]:
    """The conversation with the number of sentences per message that comes closest."""
    best: list[dict[str, str]] = []
    best_gap = tokens
    for sentences in range(1, 12):
        candidate = conversation(turns, sentences, untidy)
        gap = abs(len(await tokenizer.encode_chat(candidate)) - tokens)
        if gap < best_gap:
            best, best_gap = candidate, gap
    return best


class LoopProbe:
    """Sleeps `interval` over and over; how late each wake-up comes is how long the loop was
    blocked (a busy `sleep(0)` probe would instead starve the tokenizer thread of the GIL)."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(time.perf_counter() - started - self.interval)

    def __enter__(self) -> LoopProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


class Workload:
    """The conversation, with a new last question each time: the tokenizer remembers recent
    conversations, and a new request is what the budget must be quick for."""

    def __init__(self, tokenizer: HFPromptTokenizer, messages: list[dict[str, str]], limit: int):
        self.tokenizer = tokenizer
        self.messages = messages
        self.budget = TokenBudget(tokenizer, limit, BudgetPolicy())
        self._rounds = iter(range(10**9))

    def fresh(self) -> list[dict[str, str]]:
        question = {"role": "user", "content": f"{next(self._rounds)}: what should I do next?"}
        return [*self.messages[:-1], question]

    async def before(self) -> None:
        """What a request cost before the budget: the prompt encoded once."""
        await self.tokenizer.encode_chat(self.fresh())

    async def budgeted(self) -> None:
        await self.budget.fit_chat(self.fresh(), max_tokens=None)


async def timings(work: Workload, rounds: int) -> dict[str, float]:
    for _ in range(20):  # warm-up
        await work.before()
        await work.budgeted()
    wall: dict[str, list[float]] = {"before": [], "budget": []}
    cpu: dict[str, list[float]] = {"before": [], "budget": []}
    for _ in range(rounds):
        for name, step in (("before", work.before), ("budget", work.budgeted)):
            started_cpu, started = time.process_time(), time.perf_counter()
            await step()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
    added = [b - a for a, b in zip(wall["before"], wall["budget"], strict=True)]
    result = {
        "before_median_ms": statistics.median(wall["before"]) * 1000,
        "budget_median_ms": statistics.median(wall["budget"]) * 1000,
        "added_median_ms": statistics.median(added) * 1000,
        "added_p90_ms": statistics.quantiles(added, n=10)[-1] * 1000,
        # CPU time (all the process's threads) is steadier than wall time on a shared host.
        "cpu_added_median_ms": (statistics.median(cpu["budget"]) - statistics.median(cpu["before"]))
        * 1000,
    }
    print(
        f"{rounds} rounds: encode_chat alone (what a request cost before the budget) median "
        f"{result['before_median_ms']:.2f} ms; counting + trimming median "
        f"{result['budget_median_ms']:.2f} ms; added median {result['added_median_ms']:.2f} ms "
        f"(p90 {result['added_p90_ms']:.2f} ms); added CPU time median "
        f"{result['cpu_added_median_ms']:.2f} ms"
    )
    return result


async def loop_lag(work: Workload, rounds: int) -> dict[str, float]:
    """How late a 1 ms sleep wakes up while requests are prepared: an idle loop (the host's
    noise floor), encode_chat alone, and the budget."""
    result = {}

    async def idle() -> None:
        await asyncio.sleep(0.01)

    for name, step in (("idle", idle), ("before", work.before), ("budget", work.budgeted)):
        with LoopProbe() as probe:
            for _ in range(rounds):
                await step()
        lags = sorted(probe.lags)
        result[f"lag_max_ms[{name}]"] = lags[-1] * 1000
        print(
            f"loop lag, {name}: max {ms(lags[-1])} ms, p99 {ms(lags[int(len(lags) * 0.99)])} "
            f"ms, median {ms(statistics.median(lags))} ms ({len(lags)} wake-ups)"
        )
    return result


async def longest_callbacks(work: Workload, rounds: int) -> dict[str, float]:
    """The longest stretch the loop spends in one callback (a task step) while requests are
    prepared, in wall time and in the loop thread's own CPU time (which other processes on
    the host do not inflate). Handles are timed on asyncio's own loop: uvloop's cannot be."""
    result = {}
    original = asyncio.events.Handle._run
    for name, step in (("before", work.before), ("budget", work.budgeted)):
        durations: list[tuple[float, float]] = []

        def timed(
            handle: asyncio.events.Handle, durations: list[tuple[float, float]] = durations
        ) -> None:
            started_cpu, started = time.thread_time(), time.perf_counter()
            try:
                original(handle)
            finally:
                durations.append((time.perf_counter() - started, time.thread_time() - started_cpu))

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        try:
            for _ in range(rounds):
                await step()
        finally:
            asyncio.events.Handle._run = original  # type: ignore[method-assign]
        wall = max(d[0] for d in durations)
        cpu = max(d[1] for d in durations)
        result[f"callback_max_cpu_ms[{name}]"] = cpu * 1000
        print(
            f"longest loop callback, {name}: {ms(cpu)} ms of the loop thread's CPU time "
            f"({ms(wall)} ms wall) over {len(durations)} callbacks"
        )
    return result


def main(args: argparse.Namespace) -> dict[str, float]:
    import uvloop  # the server's loop
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    tokenizer = HFPromptTokenizer(
        AutoTokenizer.from_pretrained(bundled_model_dir(Settings(_env_file=None).model_cache_dir))  # type: ignore[call-arg]
    )
    messages = asyncio.run(sized_conversation(tokenizer, args.turns, args.tokens, args.untidy))
    work = Workload(tokenizer, messages, args.max_model_len)
    report = asyncio.run(work.budget.fit_chat(messages, max_tokens=None)).report
    print(
        f"conversation: {len(messages)} messages ({args.turns} turns), "
        f"{report.prompt_tokens_before} tokens; max_model_len {args.max_model_len}: "
        f"{report.prompt_tokens_after} tokens after, {report.messages_dropped} messages "
        f"dropped, steps {','.join(report.steps) or 'none'}, max_tokens {report.max_tokens}"
    )
    # As the server does once the engine is up: long-lived objects leave the collector alone,
    # so a full collection does not stall the loop mid-measurement.
    gc.collect()
    gc.freeze()
    result = uvloop.run(timings(work, args.rounds))
    result |= uvloop.run(loop_lag(work, args.rounds))
    result |= asyncio.run(longest_callbacks(work, args.rounds))
    tokenizer.close()
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--untidy", action="store_true", help="trailing spaces and blank-line runs everywhere"
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
