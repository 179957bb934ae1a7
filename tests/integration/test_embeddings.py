"""Embeddings on the real engines: sluicegate's in-process embedding engine (the bundled model
converted to embed) against vLLM's own server running it the same way (`--runner pooling
--convert embed`), through the `openai` SDK; the same server as an upstream pool behind the
gateway; the cache per input on a real Redis, killed mid-way."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.support.gateway import (
    GatewayProcess,
    free_port,
    running_gateway,
    started_together,
    vllm_server,
)
from tests.support.metrics import metric_value
from tests.support.redis_server import RedisProcess, running_redis

LOCAL, REMOTE = "smol-embed", "remote-embed"
TEXTS = [
    "The capital of France is Paris.",
    "Rivers flow to the sea.",
    "A recipe for bread needs flour, water and salt.",
    "GPUs multiply matrices quickly.",
]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def servers(
    redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, GatewayProcess]]:
    """vLLM's pooling server and the gateway, started at once: the gateway runs the embedding
    engine in process and fronts vLLM's server as a pool; no generative engine of its own."""
    folder = tmp_path_factory.mktemp("embeddings")
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    models = folder / "models.yaml"
    models.write_text(
        f"""
models:
  - name: {REMOTE}
    kind: embedding
    upstreams: [{{url: "{url}"}}]
"""
    )
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_EMBEDDING_MODEL": "bundled",
        "SLUICEGATE_EMBEDDING_SERVED_NAME": LOCAL,
        "SLUICEGATE_REDIS_URL": redis_server.url,
        "SLUICEGATE_UPSTREAM_START_TIMEOUT": "400",
        "SLUICEGATE_CACHE_REDIS_TIMEOUT": "1.0",
    }
    flags = ("--runner", "pooling", "--convert", "embed")
    with started_together(
        vllm_server(folder, *flags, served_model_name="smol", port=port),
        running_gateway(folder, env=env),
    ) as (vllm_url, gateway):
        yield vllm_url, gateway


@pytest.fixture(scope="module")
def vllm(servers: tuple[str, GatewayProcess]) -> OpenAI:
    return OpenAI(base_url=servers[0], api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def gateway(servers: tuple[str, GatewayProcess]) -> GatewayProcess:
    return servers[1]


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def vectors(answer: object) -> np.ndarray:
    """The answer's vectors; base64 ones (the SDK leaves them as they came when the format
    is asked for) read as OpenAI writes them, little-endian float32."""
    return np.array([_vector(item.embedding) for item in answer.data])  # type: ignore[attr-defined]


def _vector(embedding: list[float] | str) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.array(embedding)


@pytest.mark.parametrize("model", [LOCAL, REMOTE])
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_vectors_equal_vllms_in_order(
    client: OpenAI, vllm: OpenAI, model: str, encoding: str
) -> None:
    texts = [f"{text} ({model}, {encoding})" for text in TEXTS]
    ours = client.embeddings.create(model=model, input=texts, encoding_format=encoding)  # type: ignore[arg-type]
    theirs = vllm.embeddings.create(model="smol", input=texts, encoding_format=encoding)  # type: ignore[arg-type]
    assert [item.index for item in ours.data] == list(range(len(texts)))
    ours_v, theirs_v = vectors(ours), vectors(theirs)
    assert ours_v.shape == theirs_v.shape == (len(texts), 576)
    assert np.allclose(ours_v, theirs_v, atol=1e-4), np.abs(ours_v - theirs_v).max()
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    # Different texts, different vectors: the comparison above proves something.
    assert not np.allclose(ours_v[0], ours_v[1], atol=1e-2)


def test_half_seen_before_computes_only_the_other_half(
    client: OpenAI, gateway: GatewayProcess, servers: tuple[str, GatewayProcess]
) -> None:
    """The upstream engine's own counter shows what reached it: one request per input."""
    vllm_root = servers[0].removesuffix("/v1")
    fresh = [f"first batch {i}: {text}" for i, text in enumerate(TEXTS)]
    client.embeddings.create(model=REMOTE, input=fresh)
    before = metric_value(vllm_root, "vllm:request_success_total")
    mixed = [fresh[0], "never seen one", fresh[2], "never seen two"]
    raw = client.embeddings.with_raw_response.create(model=REMOTE, input=mixed)
    assert raw.headers["x-cache"] == "PARTIAL"
    answer = raw.parse()
    assert metric_value(vllm_root, "vllm:request_success_total") - before == 2
    again = client.embeddings.create(model=REMOTE, input=fresh)
    assert np.allclose(vectors(answer)[0], vectors(again)[0])
    assert np.allclose(vectors(answer)[2], vectors(again)[2])
    computed = metric_value(
        gateway.url, "sluicegate_embedding_inputs_total", model=REMOTE, outcome="computed"
    )
    assert computed >= 6


def test_redis_killed_mid_way_fails_open(
    client: OpenAI, gateway: GatewayProcess, redis_server: RedisProcess
) -> None:
    texts = [f"survives: {text}" for text in TEXTS]
    first = client.embeddings.create(model=LOCAL, input=texts)
    redis_server.kill()
    try:
        for _ in range(2):
            raw = client.embeddings.with_raw_response.create(model=LOCAL, input=texts)
            assert raw.headers["x-cache"] == "MISS"
            assert np.allclose(vectors(raw.parse()), vectors(first), atol=1e-5)
        errors = metric_value(gateway.url, "sluicegate_embedding_cache_store_errors_total")
        assert errors >= 1
    finally:
        redis_server.start()


def test_rerank_scores_like_vllms_server(
    gateway: GatewayProcess, servers: tuple[str, GatewayProcess]
) -> None:
    body = {"query": "Where is Paris?", "documents": TEXTS}
    ours = httpx.post(gateway.url + "/v1/rerank", json={**body, "model": LOCAL}, timeout=60)
    theirs = httpx.post(
        servers[0].removesuffix("/v1") + "/v1/rerank", json={**body, "model": "smol"}, timeout=60
    )
    assert ours.status_code == 200 and theirs.status_code == 200, (ours.text, theirs.text)
    ranked = [(r["index"], r["relevance_score"]) for r in ours.json()["results"]]
    expected = [(r["index"], r["relevance_score"]) for r in theirs.json()["results"]]
    assert [i for i, _ in ranked] == [i for i, _ in expected]
    assert np.allclose([s for _, s in ranked], [s for _, s in expected], atol=1e-4)


def test_the_embedding_model_is_listed(gateway: GatewayProcess) -> None:
    ids = {c["id"] for c in httpx.get(gateway.url + "/v1/models", timeout=10).json()["data"]}
    assert ids == {LOCAL, REMOTE}
