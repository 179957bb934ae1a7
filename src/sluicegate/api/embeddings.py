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

Every request is held to its key's share of the embedding engine, in inputs
(`quota.share.KeyShare`: a 429 past it, checked before the body is parsed too), to
REQUEST_TIMEOUT (a 504) and to its client (`shared_work`: the engine's work is cancelled when
either ends first). The cosines and the JSON of an answer of megabytes are computed off the
event loop (`offload`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluicegate.api.deps import StateDep, models_for
from sluicegate.api.route import EmbeddingRoute
from sluicegate.engine.protocol import Embedding
from sluicegate.http.asgi import api_key_id, counted
from sluicegate.http.disconnect import until_disconnect
from sluicegate.http.state import AppState
from sluicegate.inference.embeddings import EmbeddingInput, request_id
from sluicegate.models.served import ServedEmbedder
from sluicegate.observability.record import current_request, mark_model
from sluicegate.offload import offload
from sluicegate.wire.embeddings import EmbeddingRequest, embeddings_json
from sluicegate.wire.rerank import RerankRequest, ScoreRequest, cosines, rerank_body, score_body

router = APIRouter(prefix="/v1", tags=["embeddings"], route_class=EmbeddingRoute)

T = TypeVar("T")
_TEXTS = {"/rerank": "documents", "/score": "text_2"}
"""The parameter a forwarded request's texts are named by."""


@router.post("/embeddings", response_model=None)
async def create_embeddings(body: EmbeddingRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    inputs = model.service.check(body)
    embedded = await shared_work(
        state,
        request,
        len(inputs),
        "input",
        lambda: embed(state, request, model, inputs, body.dimensions, body.truncate_prompt_tokens),
    )
    vectors = [e.vector for e in embedded.vectors]
    model.service.check_size(vectors)
    values = sum(len(v) for v in vectors)
    content = await offload.run(
        values, embeddings_json, model.name, vectors, embedded.tokens, body.encoding_format
    )
    return Response(content, media_type="application/json", headers=embedded.headers)


@router.post("/rerank", response_model=None)
async def rerank(body: RerankRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    count = 1 + len(body.documents)
    if model.forward is not None:
        return await _forwarded(state, request, model, "/rerank", body.model_dump(), count)
    texts = [body.query, *body.texts()]
    embedded = await shared_work(
        state,
        request,
        count,
        "documents",
        lambda: embed(state, request, model, texts, None, body.truncate_prompt_tokens),
    )
    query, *documents = [e.vector for e in embedded.vectors]
    pairs = [(0, j) for j in range(len(documents))]
    scores = await _cosines([query], documents, pairs)
    content = rerank_body(model.name, body.documents, scores, body.top_n, embedded.tokens)
    return _json(content, headers=embedded.headers)


@router.post("/score", response_model=None)
async def score(body: ScoreRequest, request: Request, state: StateDep) -> Response:
    model = models_for(request, state).resolve_embedder(body.model)
    first, second = body.sides()
    count = len(first) + len(second)
    if model.forward is not None:
        return await _forwarded(state, request, model, "/score", body.model_dump(), count)
    embedded = await shared_work(
        state,
        request,
        count,
        "text_2",
        lambda: embed(state, request, model, [*first, *second], None, body.truncate_prompt_tokens),
    )
    vectors = [e.vector for e in embedded.vectors]
    scores = await _cosines(vectors[: len(first)], vectors[len(first) :], body.pairs())
    content = score_body(model.name, scores, embedded.tokens)
    return _json(content, headers=embedded.headers)


async def shared_work(
    state: AppState, request: Request, count: int, param: str, work: Callable[[], Awaitable[T]]
) -> T:
    """`work()`, its `count` inputs held in the key's embedding share meanwhile (a 429 while
    the key holds it; a 400 naming `param` for more than the whole share), cancelled when the
    client leaves or REQUEST_TIMEOUT passes (a 504), as a chat completion is."""
    key_id = api_key_id(request.scope)
    share = state.quotas.embedding_share
    share.take_some(key_id, count, param)
    try:
        return await until_disconnect(request.receive, work(), state.timeouts.request)
    finally:
        share.give_back(key_id, count)


async def _cosines(
    left: list[list[float]], right: list[list[float]], pairs: Sequence[tuple[int, int]]
) -> list[float]:
    """The pairs' cosines, in a thread when there are many values (`offload`)."""
    size = len(pairs) * (len(left[0]) if left else 0)
    return await offload.run(size, cosines, left, right, pairs)


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
    state: AppState,
    request: Request,
    model: ServedEmbedder,
    path: str,
    body: dict[str, Any],
    count: int,
) -> Response:
    """The request as its pool's upstreams answer it, its model renamed both ways; charged
    the tokens their usage says. Its `count` texts are held in the key's share meanwhile."""
    work = functools.partial(_forward, state, request, model, path, body)
    return await shared_work(state, request, count, _TEXTS[path], work)


async def _forward(
    state: AppState, request: Request, model: ServedEmbedder, path: str, body: dict[str, Any]
) -> Response:
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
    """A JSON answer written by orjson, in a fraction of the standard library's time (a
    score per input: its size is the request's)."""
    return Response(orjson.dumps(content), media_type="application/json", headers=headers)
