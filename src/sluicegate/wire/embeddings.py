"""`POST /v1/embeddings` in OpenAI's shapes (with vLLM's `truncate_prompt_tokens`).

`input` is a string, a list of strings, a list of token ids, or a list of such lists; the
answer lists one embedding per input, in order, as floats or as base64 (the vector's float32
values, little-endian, as OpenAI's SDKs decode it). It is written a vector at a time
(`embeddings_json`), so that a thread writing megabytes of it lets the event loop in between.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, field_validator

from sluicegate.wire.requests import INT32_MAX, RequestModel

MAX_INPUTS = 2048
"""The most inputs one request may hold, whatever the settings (OpenAI's own bound)."""

TokenIds = list[Annotated[int, Field(ge=0, le=INT32_MAX)]]


class EmbeddingRequest(RequestModel):
    model: str = Field(min_length=1)
    input: str | list[str] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=INT32_MAX)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    """vLLM's: keep the last N tokens of a longer input (-1: as many as the model takes);
    unset, an input over the model's window is a 400."""

    @field_validator("input")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("input must not be empty")
            if len(value) > MAX_INPUTS:
                raise ValueError(f"at most {MAX_INPUTS} inputs are accepted")
            if isinstance(value[0], list) and any(not ids for ids in value):
                raise ValueError("an input of token ids must not be empty")
        return value

    def inputs(self) -> list[str | list[int]]:
        """The inputs one by one: texts, or lists of token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]
        return list(value)  # type: ignore[arg-type]


def encoded(vector: Sequence[float], encoding: str) -> list[float] | str:
    """A vector as the request's `encoding_format` asks."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return list(vector)


def embeddings_json(
    model: str, vectors: Sequence[Sequence[float]], prompt_tokens: int, encoding: str
) -> bytes:
    """The answer as JSON: `object`, `data` (each vector as `encoding` asks), `model`,
    `usage`. Each vector is one short call, none of them the whole answer."""
    data = b",".join(
        orjson.dumps(
            {"object": "embedding", "index": index, "embedding": encoded(vector, encoding)}
        )
        for index, vector in enumerate(vectors)
    )
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    rest = orjson.dumps({"model": model, "usage": usage})
    return b'{"object":"list","data":[' + data + b"]," + rest[1:]
