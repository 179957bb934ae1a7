"""`/v1/embeddings`, `/v1/rerank` and `/v1/score` over a fake embedding engine: shapes, the
per-input cache (what is computed, in one call; identical inputs once; a failing store), the
bounds, the limits. The real engine and vLLM's server are in
tests/integration/test_embeddings.py."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.fakes import (
    FAKE_EMBEDDER,
    FAKE_MODEL,
    FakeEmbedder,
    fake_app,
    serve_in_thread,
)
from tests.support.gateway import free_port
from tests.support.metrics import local_value

EMBED = "/v1/embeddings"


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def client(embedder: FakeEmbedder) -> Iterator[TestClient]:
    with TestClient(fake_app(embedder=embedder)) as client:
        yield client


def embed(client: TestClient, inputs: Any, **extra: Any) -> httpx.Response:
    return client.post(EMBED, json={"model": FAKE_EMBEDDER, "input": inputs, **extra})


def flat(vectors: list[list[float]]) -> list[float]:
    return [x for vector in vectors for x in vector]


def computed(embedder: FakeEmbedder) -> list[list[list[int]]]:
    return [[p.ids for p in call] for call in embedder.calls]


def test_every_input_gets_its_vector_in_order(client: TestClient, embedder: FakeEmbedder) -> None:
    response = embed(client, ["one two", "three", "four five six"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == FAKE_EMBEDDER
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    expected = [embedder.vector(ids) for ids in ([3, 3], [5], [4, 4, 3])]
    assert flat([d["embedding"] for d in body["data"]]) == pytest.approx(flat(expected))
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    assert computed(embedder) == [[[3, 3], [5], [4, 4, 3]]]  # one engine call for all


def test_base64_is_float32_little_endian(client: TestClient, embedder: FakeEmbedder) -> None:
    body = embed(client, "one two", encoding_format="base64").json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(embedder.vector([3, 3]))


@pytest.mark.parametrize("shape", ["text", "ids", "ids_list", "text_list"])
def test_inputs_come_as_text_or_token_ids(client: TestClient, shape: str) -> None:
    inputs = {"text": "a b", "ids": [1, 2], "ids_list": [[1, 2], [3]], "text_list": ["a", "b c"]}
    body = embed(client, inputs[shape]).json()
    assert len(body["data"]) == (2 if shape.endswith("list") else 1)


def test_a_second_request_computes_only_the_inputs_not_seen(
    client: TestClient, embedder: FakeEmbedder
) -> None:
    seen = [f"text number {i}" for i in range(4)]
    first = embed(client, seen)
    assert first.headers["x-cache"] == "MISS"
    cached = local_value("sluicegate_embedding_inputs_total", model=FAKE_EMBEDDER, outcome="cached")
    mixed = [seen[0], "a new one", seen[2], "another new one"]
    second = embed(client, mixed)
    assert second.headers["x-cache"] == "PARTIAL"
    assert computed(embedder)[-1] == [[1, 3, 3], [7, 3, 3]]
    expected = [embedder.vector(ids) for ids in ([4, 6, 1], [1, 3, 3], [4, 6, 1], [7, 3, 3])]
    assert flat([d["embedding"] for d in second.json()["data"]]) == pytest.approx(flat(expected))
    assert second.json()["usage"]["prompt_tokens"] == 12  # the cached ones count too
    assert (
        local_value("sluicegate_embedding_inputs_total", model=FAKE_EMBEDDER, outcome="cached")
        == cached + 2
    )
    third = embed(client, list(reversed(mixed)))
    assert third.headers["x-cache"] == "HIT" and len(embedder.calls) == 2


def test_identical_inputs_of_one_request_are_computed_once(
    client: TestClient, embedder: FakeEmbedder
) -> None:
    body = embed(client, ["same text", "other", "same text"]).json()
    assert computed(embedder) == [[[4, 4], [5]]]
    assert body["data"][0]["embedding"] == body["data"][2]["embedding"]


def test_dimensions_and_truncation_are_parts_of_the_key(embedder: FakeEmbedder) -> None:
    embedder.matryoshka = True
    with TestClient(fake_app(embedder=embedder)) as client:
        embed(client, "a b c")
        short = embed(client, "a b c", dimensions=4)
        assert short.headers["x-cache"] == "MISS" and len(short.json()["data"][0]["embedding"]) == 4
        cut = embed(client, "a b c", truncate_prompt_tokens=2)
        assert cut.headers["x-cache"] == "MISS"
        assert computed(embedder)[-1] == [[1, 1]]  # the last two tokens, as vLLM keeps them


@pytest.mark.parametrize(
    ("inputs", "extra", "param", "says"),
    [
        (["x"] * 3000, {}, "input", "at most 2048"),
        ([], {}, "input", "must not be empty"),
        ("word " * 100, {}, "input", "64-token window"),
        (["ok", "word " * 100], {}, "input.1", "64-token window"),
        ("a b", {"dimensions": 4}, "dimensions", "does not support dimensions=4"),
        ([[]], {}, "input", "must not be empty"),
    ],
)
def test_bad_requests_are_400s_naming_the_input(
    client: TestClient, inputs: Any, extra: dict[str, Any], param: str, says: str
) -> None:
    response = embed(client, inputs, **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_a_long_input_is_cut_when_asked(client: TestClient, embedder: FakeEmbedder) -> None:
    response = embed(client, "word " * 100, truncate_prompt_tokens=-1)
    assert response.status_code == 200
    assert len(computed(embedder)[-1][0]) == 64


def test_models_of_the_other_kind_say_what_they_serve(client: TestClient) -> None:
    chat_on_embed = client.post(EMBED, json={"model": FAKE_MODEL, "input": "x"})
    assert chat_on_embed.status_code == 400
    assert "does not serve embeddings" in chat_on_embed.json()["error"]["message"]
    body = {"model": FAKE_EMBEDDER, "messages": [{"role": "user", "content": "hi"}]}
    embed_on_chat = client.post("/v1/chat/completions", json=body)
    assert embed_on_chat.status_code == 400
    assert "serves embeddings" in embed_on_chat.json()["error"]["message"]
    assert client.post(EMBED, json={"model": "nope", "input": "x"}).status_code == 404
    cards = {c["id"] for c in client.get("/v1/models").json()["data"]}
    assert cards == {FAKE_MODEL, FAKE_EMBEDDER}


def test_tokens_count_against_the_keys_limits(embedder: FakeEmbedder) -> None:
    with TestClient(fake_app(embedder=embedder, rate_limit_tokens_per_minute=10)) as client:
        assert embed(client, "a b c d e f").status_code == 200
        refused = embed(client, "a b c d e f")
        assert refused.status_code == 429
        assert len(embedder.calls) == 1


def test_a_failing_store_computes_everything_and_fails_nothing(embedder: FakeEmbedder) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with TestClient(fake_app(embedder=embedder, redis_url=dead)) as client:
        for _ in range(2):
            response = embed(client, ["a b", "c"])
            assert response.status_code == 200 and response.headers["x-cache"] == "MISS"
    assert len(embedder.calls) == 2


async def test_requests_in_flight_together_compute_an_input_once(embedder: FakeEmbedder) -> None:
    embedder.delay = 0.3
    with serve_in_thread(fake_app(embedder=embedder)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            body = {"model": FAKE_EMBEDDER, "input": ["shared input", "mine"]}
            other = {"model": FAKE_EMBEDDER, "input": ["shared input", "yours"]}
            first, second = await asyncio.gather(
                http.post(EMBED, json=body), http.post(EMBED, json=other)
            )
    assert first.status_code == second.status_code == 200
    everything = [ids for call in computed(embedder) for ids in call]
    assert everything.count([6, 5]) == 1  # "shared input", once in all
    assert first.json()["data"][0]["embedding"] == second.json()["data"][0]["embedding"]


def test_rerank_and_score_are_cosine_similarities(
    client: TestClient, embedder: FakeEmbedder
) -> None:
    ranked = client.post(
        "/v1/rerank",
        json={
            "model": FAKE_EMBEDDER,
            "query": "a b",
            "documents": ["a b", "x", "c d e"],
            "top_n": 2,
        },
    )
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert len(results) == 2 and results[0]["index"] == 0
    assert results[0]["relevance_score"] == pytest.approx(1.0)
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert results[0]["document"] == {"text": "a b"}
    scored = client.post(
        "/v1/score", json={"model": FAKE_EMBEDDER, "text_1": "a b", "text_2": ["a b", "x"]}
    ).json()
    assert [d["index"] for d in scored["data"]] == [0, 1]
    assert scored["data"][0]["score"] == pytest.approx(1.0)
    assert scored["usage"]["prompt_tokens"] == 2 + 2 + 1
    assert (
        client.post(
            "/v1/score", json={"model": FAKE_EMBEDDER, "text_1": ["a", "b"], "text_2": ["a"]}
        ).status_code
        == 400
    )
