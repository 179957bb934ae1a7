from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from sluicegate.engine.tokenizer import (
    COUNT_BATCH,
    COUNT_BATCH_CHARS,
    HFPromptTokenizer,
    count_batches,
)


class SlowTokenizer:
    """Stands in for a Hugging Face tokenizer whose work takes real time."""

    chat_template = "{{ messages }}"

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __len__(self) -> int:
        return 100

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **kwargs: object) -> str:
        return " ".join(m["content"] for m in messages)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        if len(text) > 10:
            time.sleep(0.3)
        return [len(w) for w in text.split()]


async def test_long_prompts_are_encoded_off_the_event_loop() -> None:
    slow = SlowTokenizer()
    tokenizer = HFPromptTokenizer(slow, inline_limit_chars=10)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    ids = await tokenizer.encode_chat([{"role": "user", "content": "word " * 100}])
    task.cancel()
    assert ids == [4] * 100
    # Encoded on the tokenizer's thread (what proves it), and the loop ran meanwhile: about
    # 30 ticks in the 0.3 s alone, a few asked for, so a loaded machine's slower ticks pass.
    assert slow.threads[-1].startswith("tokenizer"), slow.threads
    assert ticks >= 3, f"the loop ticked {ticks} times while the prompt was encoded"
    tokenizer.close()


async def test_short_prompts_are_encoded_inline() -> None:
    slow = SlowTokenizer()
    tokenizer = HFPromptTokenizer(slow, inline_limit_chars=10)
    assert await tokenizer.encode("a bb") == [1, 2]
    assert slow.threads[-1] == threading.current_thread().name
    tokenizer.close()


def test_counts_are_made_in_batches_bounded_in_characters() -> None:
    """2,000 texts of 4 KB are not one call (its encodings, 1.8M tokens, would be made into
    Python objects and freed holding the GIL); order is kept, a long text goes alone."""
    texts = [f"{i} " + "x" * 4000 for i in range(2000)]
    batches = list(count_batches(texts))
    assert [t for batch in batches for t in batch] == texts
    assert all(sum(map(len, batch)) <= COUNT_BATCH_CHARS for batch in batches)
    assert max(map(len, batches)) < COUNT_BATCH
    long = "y" * (COUNT_BATCH_CHARS + 1)
    assert list(count_batches(["a", long, "b"])) == [["a"], [long], ["b"]]
    assert list(count_batches(["a"] * (COUNT_BATCH + 1))) == [["a"] * COUNT_BATCH, ["a"]]
    assert list(count_batches([])) == []


def test_batched_counts_are_the_tokenizers_own(hf_tokenizer: HFPromptTokenizer) -> None:
    texts = [f"Sentence number {i} of many. " * (i % 40 + 1) for i in range(3000)]
    tokenizer = hf_tokenizer.hf_tokenizer
    expected = [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    assert hf_tokenizer._count_sync(texts) == expected
