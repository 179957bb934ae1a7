"""A stand-in for vLLM's `AsyncLLM` in unit tests of the in-process adapter
(`engine.vllm_engine`): it is not vLLM, it records what the adapter hands it and answers each
request with one finished output."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any


class RecordingLLM:
    """Answers every request with one finished output of `token_ids` (its text `text`),
    recording each call: prompt, sampling parameters, request id, priority, adapter, and the
    other keyword arguments (the reasoning state vLLM's chat server passes)."""

    errored = False

    def __init__(
        self, text: str = "Hi", token_ids: Sequence[int] = (7,), finish_reason: str = "length"
    ) -> None:
        self._text = text
        self._token_ids = list(token_ids)
        self._finish_reason = finish_reason
        self.calls: list[tuple[Any, Any, str]] = []
        self.params: list[Any] = []
        self.priorities: list[int] = []
        self.loras: list[Any] = []
        self.extra: list[dict[str, Any]] = []

    async def generate(
        self,
        prompt: Any,
        params: Any,
        request_id: str,
        *,
        priority: int = 0,
        lora_request: Any = None,
        **extra: Any,
    ) -> AsyncIterator[Any]:
        self.calls.append((prompt, params, request_id))
        self.params.append(params)
        self.priorities.append(priority)
        self.loras.append(lora_request)
        self.extra.append(extra)
        output = SimpleNamespace(
            index=0,
            text=self._text,
            token_ids=list(self._token_ids),
            finish_reason=self._finish_reason,
            logprobs=None,
        )
        yield SimpleNamespace(
            outputs=[output],
            prompt_token_ids=prompt["prompt_token_ids"],
            finished=True,
            metrics=None,
        )
