"""Embeddings: from a request's inputs to the engine's vectors, with the bounds on what one
request may ask.

The service knows nothing of HTTP or of the cache: it checks a request (how many inputs,
how long, which `dimensions`), turns the inputs the cache did not have into prompts (token
ids, counted and fitted to the model's window, or refused), and has the engine embed them in
one call. `cache.embedding_cache` decides which inputs need it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.engine.protocol import MAX_TOKEN_CHARS, Embedding, EmbeddingEngine, Prompt
from sluicegate.errors import ContextLengthExceededError, InvalidRequestError
from sluicegate.wire.embeddings import EmbeddingRequest

EmbeddingInput = str | list[int]
"""One input: a text, or token ids."""


@dataclass(frozen=True, slots=True)
class EmbeddingLimits:
    max_inputs: int = 2048
    """Inputs one request may hold."""
    max_values: int = 4_194_304
    """Values (inputs × dimensions) one answer may hold: what bounds its size."""


class EmbeddingService:
    def __init__(
        self,
        engine: EmbeddingEngine,
        model_name: str,
        limits: EmbeddingLimits | None = None,
        *,
        identity: str = "",
    ) -> None:
        """`identity` is what the vectors depend on besides the input (the weights)."""
        self.engine = engine
        self.model_name = model_name
        self.identity = identity or model_name
        self._limits = limits or EmbeddingLimits()

    def check(self, request: EmbeddingRequest) -> list[EmbeddingInput]:
        """The request's inputs, once what costs nothing to check is checked: their number,
        token ids inside the vocabulary, texts that could fit the window at all."""
        inputs = request.inputs()
        if len(inputs) > self._limits.max_inputs:
            raise InvalidRequestError(
                f"At most {self._limits.max_inputs} inputs are accepted; {len(inputs)} were sent.",
                param="input",
            )
        if request.dimensions is not None:
            self._check_values(len(inputs), request.dimensions, "dimensions")
        tokenizer = self.engine.tokenizer
        window = self.engine.max_model_len
        for index, item in enumerate(inputs):
            where = "input" if len(inputs) == 1 else f"input.{index}"
            if isinstance(item, list):
                if tokenizer is not None:
                    vocab = tokenizer.vocab_size
                    outside = next((t for t in item if t >= vocab), None)
                    if outside is not None:
                        raise InvalidRequestError(
                            f"token ids must be in [0, {vocab}); {outside} is not.", param=where
                        )
                if len(item) > window and request.truncate_prompt_tokens is None:
                    raise _too_long(len(item), window, where)
            elif request.truncate_prompt_tokens is None and len(item) > MAX_TOKEN_CHARS * window:
                raise _too_long(None, window, where)
        return inputs

    def check_size(self, vectors: Sequence[Sequence[float]]) -> None:
        """Raise `InvalidRequestError` when the answer would hold more values than it may (the
        model's own size, when `dimensions` was not sent, is known once it has answered)."""
        if vectors:
            self._check_values(len(vectors), len(vectors[0]), "input")

    def _check_values(self, inputs: int, dimensions: int, param: str) -> None:
        if inputs * dimensions > self._limits.max_values:
            raise InvalidRequestError(
                f"This answer would hold {inputs} inputs × {dimensions} dimensions, more than "
                f"the {self._limits.max_values} values an answer may hold: send fewer inputs "
                "(or fewer dimensions).",
                param=param,
            )

    async def prompts(
        self,
        inputs: Sequence[EmbeddingInput],
        truncate: int | None,
        positions: Sequence[int],
        total: int,
    ) -> list[Prompt]:
        """The inputs as the engine gets them: token ids fitted to the window (the last
        `truncate` of them kept, as vLLM keeps them), or an input over it refused. Texts go
        as text to an engine that has no tokenizer (an upstream counts them itself).
        `positions`: each input's place among the request's `total`, for the error's
        `param`."""
        tokenizer = self.engine.tokenizer
        window = self.engine.max_model_len
        keep = window if truncate is None or truncate == -1 else min(truncate, window)
        prompts = []
        for item, position in zip(inputs, positions, strict=True):
            if isinstance(item, str) and tokenizer is None:
                prompts.append(Prompt([], text=item))
                continue
            ids = await tokenizer.encode(item) if isinstance(item, str) else item  # type: ignore[union-attr]
            if len(ids) > window and truncate is None:
                where = "input" if total == 1 else f"input.{position}"
                raise _too_long(len(ids), window, where)
            prompts.append(Prompt(ids[-keep:] if len(ids) > keep else ids))
        return prompts

    async def compute(
        self, prompts: Sequence[Prompt], dimensions: int | None, request_id: str
    ) -> list[Embedding]:
        """The engine's vectors for `prompts`, in one call."""
        return await self.engine.embed(request_id, prompts, dimensions)

    async def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None:
            await self.engine.check_dimensions(dimensions)


def request_id() -> str:
    return f"embd-{time.time_ns():x}"


def _too_long(tokens: int | None, window: int, param: str) -> ContextLengthExceededError:
    count = "more characters than" if tokens is None else f"{tokens} tokens, more than"
    return ContextLengthExceededError(
        f"This input has {count} the model's {window}-token window can hold. Shorten it, or "
        "send truncate_prompt_tokens to keep its last tokens.",
        param=param,
    )
