"""Prompt tokenization with the model's own tokenizer and chat template.

Short inputs are encoded inline: a thread hop would cost more than the work. Long ones go to
a single worker thread, so a 100k-character prompt never stalls the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Characters above which encoding moves off the event loop (~0.2 ms of work inline).
INLINE_LIMIT_CHARS = 2048


class HFPromptTokenizer:
    """`PromptTokenizer` over a Hugging Face tokenizer (what vLLM's `get_tokenizer` returns)."""

    def __init__(self, tokenizer: Any, inline_limit_chars: int = INLINE_LIMIT_CHARS):
        self._tokenizer = tokenizer
        self._inline_limit = inline_limit_chars
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template")

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    async def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        size = sum(len(m["content"]) for m in messages)
        return await self._run(size, self._encode_chat_sync, messages)

    async def encode(self, text: str) -> list[int]:
        return await self._run(len(text), self._encode_sync, text)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _encode_chat_sync(self, messages: Sequence[dict[str, str]]) -> list[int]:
        # Same two steps as vLLM's server: render the template to text, then tokenize it
        # without adding special tokens again (the template already has them).
        text = self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _encode_sync(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))

    async def _run(self, size: int, fn: Callable[[T], list[int]], arg: T) -> list[int]:
        if size <= self._inline_limit:
            return fn(arg)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, arg)
