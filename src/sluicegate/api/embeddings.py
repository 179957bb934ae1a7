"""`POST /v1/embeddings` (OpenAI's shapes), and `POST /v1/rerank` and `POST /v1/score`
(vLLM's server's), on the in-process embedding engine or an upstream pool, each input's vector
from the embedding cache where it is kept.

`embed` reads top to bottom: check the request (what costs nothing), look every input up in
the cache (one round trip), count and fit the inputs not found, admit the request's tokens
against the key's and the model's limits, compute what is missing in one engine call
(identical inputs once; inputs another request is computing are waited for), and hand back
every input's embedding in order. `X-Cache` says `HIT` (all found), `PARTIAL` or `MISS`.

Rerank and score are cosine similarities of embeddings, as vLLM's server scores with an
embedding model, so they share the cache. A pool of `kind: rerank` (cross-encoders) is asked
itself: the request goes to its upstreams as it came, its model renamed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluicegate.api.deps import StateDep, models_for
from sluicegate.api.route import LargeBodyRoute
from sluicegate.engine.protocol import Embedding
from sluicegate.http.asgi import api_key_id, counted
from sluicegate.http.state import AppState
from sluicegate.inference.embeddings import EmbeddingInput, request_id
from sluicegate.models.served import ServedEmbedder
from sluicegate.observability.record import current_request, mark_model
from sluicegate.wire.embeddings import EmbeddingRequest, embeddings_body
from sluicegate.wire.rerank import RerankRequest, ScoreRequest, cosine, rerank_body, score_body

router = APIRouter(prefix="/v1", tags=["embeddings"], route_class=LargeBodyRoute)


@router.post("/embeddings", response_model=None)
async def create_embeddings(body: EmbeddingRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    inputs = model.service.check(body)
    embedded = await embed(
        state, request, model, inputs, body.dimensions, body.truncate_prompt_tokens
    )
    content = embeddings_body(
        model.name, [e.vector for e in embedded.vectors], embedded.tokens, body.encoding_format
    )
    return _json(content, headers=embedded.headers)


@router.post("/rerank", response_model=None)
async def rerank(body: RerankRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    if model.forward is not None:
        return await _forwarded(state, request, model, "/rerank", body.model_dump())
    texts = [body.query, *body.texts()]
    embedded = await embed(state, request, model, texts, None, body.truncate_prompt_tokens)
    query, *documents = embedded.vectors
    scores = [cosine(query.vector, d.vector) for d in documents]
    content = rerank_body(model.name, body.documents, scores, body.top_n, embedded.tokens)
    return _json(content, headers=embedded.headers)


@router.post("/score", response_model=None)
async def score(body: ScoreRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    if model.forward is not None:
        return await _forwarded(state, request, model, "/score", body.model_dump())
    first, second = body.sides()
    embedded = await embed(
        state, request, model, [*first, *second], None, body.truncate_prompt_tokens
    )
    left, right = embedded.vectors[: len(first)], embedded.vectors[len(first) :]
    scores = [cosine(left[i].vector, right[j].vector) for i, j in body.pairs()]
    content = score_body(model.name, scores, embedded.tokens)
    return _json(content, headers=embedded.headers)


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[Embedding]
    tokens: int
    headers: dict[str, str]


async def embed(
    state: AppState,
    request: Request,
    model: ServedEmbedder,
    inputs: Sequence[EmbeddingInput],
    dimensions: int | None,
    truncate: int | None,
) -> Embedded:
    """Every input's embedding, in order (see the module doc)."""
    mark_model(model.name)
    service = model.service
    await service.check_dimensions(dimensions)
    key_id = api_key_id(request.scope)
    batch = state.embeddings.batch(
        model.name, service.identity, inputs, dimensions, truncate, key_id
    )
    await batch.look_up()
    try:
        missing, positions = batch.missing()
        prompts = await service.prompts(missing, truncate, positions, len(inputs))
        reserved = batch.cached_tokens() + sum(p.length for p in prompts)
        reservation = await state.quotas.reserve(
            key_id,
            reserved,
            sequences=0,
            max_tokens=0,
            counted=counted(request.scope),
            model=model.quota,
        )
    except BaseException:
        batch.abandon()
        raise
    used = 0
    try:
        rid = request_id()
        vectors = await batch.compute(prompts, lambda todo: service.compute(todo, dimensions, rid))
        used = sum(e.prompt_tokens for e in vectors)
    finally:
        # What the engine counted (none when it failed): charged instead of the reservation.
        await state.quotas.release(reservation, 0, prompt_tokens=used)
    if (record := current_request()) is not None:
        record.add_usage(used, 0, cached=batch.cached_tokens())
    return Embedded(vectors, used, {"x-cache": batch.outcome, **reservation.headers})


async def _forwarded(
    state: AppState, request: Request, model: ServedEmbedder, path: str, body: dict[str, Any]
) -> Response:
    """The request as its pool's upstreams answer it, its model renamed both ways; charged
    the tokens their usage says."""
    assert model.forward is not None
    mark_model(model.name)
    key_id = api_key_id(request.scope)
    reservation = await state.quotas.reserve(
        key_id, 0, sequences=0, max_tokens=0, counted=counted(request.scope), model=model.quota
    )
    used = 0
    try:
        answer = await model.forward(path, {**body, "model": model.root})
        used = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
    finally:
        await state.quotas.release(reservation, 0, prompt_tokens=used)
    answer["model"] = model.name
    if (record := current_request()) is not None:
        record.add_usage(used, 0)
    return _json(answer, headers=reservation.headers)


def _json(content: Any, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON answer written by orjson: thousands of floats per vector, in a fraction of the
    standard library's time."""
    return Response(orjson.dumps(content), media_type="application/json", headers=headers)
