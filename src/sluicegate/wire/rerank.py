"""`POST /v1/rerank` and `POST /v1/score` in vLLM's server's shapes.

A rerank request scores each of its `documents` against its `query`; a score request scores
`text_1` against each of `text_2` (or pairwise, when both are lists of one length). With an
embedding model a score is the cosine similarity of the two texts' embeddings, as vLLM's server
computes it for embedding models.
"""

from __future__ import annotations

import math
import operator
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field, model_validator

from sluicegate.wire.embeddings import MAX_INPUTS
from sluicegate.wire.requests import RequestModel

Document = str | dict[str, Any]


def document_text(document: Document) -> str:
    """A document's text: a string, or an object with `text` (Cohere's shape)."""
    if isinstance(document, str):
        return document
    text = document.get("text")
    if not isinstance(text, str):
        raise ValueError("a document is a string or an object with its text")
    return text


class RerankRequest(RequestModel):
    model: str = Field(min_length=1)
    query: str
    documents: Annotated[list[Document], Field(min_length=1, max_length=MAX_INPUTS - 1)]
    top_n: int = Field(default=0, ge=0)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)

    @model_validator(mode="after")
    def _texts(self) -> RerankRequest:
        for document in self.documents:
            document_text(document)
        return self

    def texts(self) -> list[str]:
        return [document_text(d) for d in self.documents]


class ScoreRequest(RequestModel):
    model: str = Field(min_length=1)
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)

    @model_validator(mode="after")
    def _pairs(self) -> ScoreRequest:
        first, second = self.sides()
        if not first or not second:
            raise ValueError("give text_1 and text_2 (or queries and documents)")
        if len(first) > 1 and len(first) != len(second):
            raise ValueError("text_1 is one text, or as many texts as text_2")
        if len(first) + len(second) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} texts are accepted in all")
        return self

    def sides(self) -> tuple[list[str], list[str]]:
        first = self.text_1 if self.text_1 is not None else self.queries
        second = self.text_2 if self.text_2 is not None else self.documents
        return _listed(first), _listed(second)

    def pairs(self) -> list[tuple[int, int]]:
        """(index in `text_1`, index in `text_2`) of each score: one text against each, or
        pairwise."""
        first, second = self.sides()
        if len(first) == 1:
            return [(0, j) for j in range(len(second))]
        return [(i, i) for i in range(len(second))]


def _listed(side: str | list[str] | None) -> list[str]:
    if side is None:
        return []
    return [side] if isinstance(side, str) else list(side)


def cosines(
    left: Sequence[Sequence[float]],
    right: Sequence[Sequence[float]],
    pairs: Sequence[tuple[int, int]],
) -> list[float]:
    """The cosine similarity of `left[i]` and `right[j]` for each pair `(i, j)`. Each vector's
    norm is taken once, however many pairs it is in; each product is a short call, so a thread
    computing them lets the event loop in between (`offload`)."""
    left_norms = [_norm(v) for v in left]
    right_norms = [_norm(v) for v in right]
    scores = []
    for i, j in pairs:
        a, b = left[i], right[j]
        if len(a) != len(b):
            raise ValueError("vectors of different sizes")
        norm = left_norms[i] * right_norms[j]
        scores.append(sum(map(operator.mul, a, b)) / norm if norm else 0.0)
    return scores


def _norm(vector: Sequence[float]) -> float:
    return math.sqrt(sum(map(operator.mul, vector, vector)))


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def rerank_body(
    model: str, documents: list[Document], scores: list[float], top_n: int, tokens: int
) -> dict[str, Any]:
    ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    if 0 < top_n < len(ranked):
        ranked = ranked[:top_n]
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "model": model,
        "usage": _usage(tokens),
        "results": [
            {
                "index": i,
                "document": {"text": document_text(documents[i])},
                "relevance_score": scores[i],
            }
            for i in ranked
        ],
    }


def score_body(model: str, scores: list[float], tokens: int) -> dict[str, Any]:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": _usage(tokens),
    }
