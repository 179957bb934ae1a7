from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from sluicegate.engine.tokenizer import HFPromptTokenizer


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
