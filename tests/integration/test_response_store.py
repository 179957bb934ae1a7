"""The Responses API's store on a real Redis and the real engine: each API key's bound on
stored bytes (one key's large records never push out another's; its own oldest go first),
and with `truncation: "auto"` the conversation stored is the one the prompt held."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from sluicegate.keys import ApiKeyring
from tests.support.gateway import MODEL_NAME, GatewayProcess, running_gateway
from tests.support.redis_server import RedisProcess, running_redis

KEY_A, KEY_B = "sk-store-a-51c8", "sk-store-b-07e2"
KEY_BOUND = 16 * 1024
"""Bytes of records per key: three records of about 5 kB."""
PREFIX = "sluicegate"


def key_id(key: str) -> str:
    found = ApiKeyring.parse(key).identify(key)
    assert found is not None
    return found


def headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "cache-control": "no-cache"}


def long_text(seed: int, sentences: int) -> str:
    """Distinct sentences (no two messages alike, nothing for truncation to collapse)."""
    return " ".join(
        f"Note {seed}.{i}: the river by mill {seed * 31 + i} rose {i % 7} feet overnight."
        for i in range(sentences)
    )


@pytest.fixture(scope="module")
def store_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, store_redis: RedisProcess
) -> Iterator[GatewayProcess]:
    env = {
        "SLUICEGATE_API_KEYS": f"{KEY_A},{KEY_B}",
        "SLUICEGATE_REDIS_URL": store_redis.url,
        "SLUICEGATE_RESPONSES_MAX_ENTRY_BYTES": str(KEY_BOUND),
        "SLUICEGATE_RESPONSES_MAX_BYTES_PER_KEY": str(KEY_BOUND),
    }
    with running_gateway(tmp_path_factory.mktemp("gateway"), env=env) as process:
        yield process


def test_one_keys_large_records_never_push_out_another_keys(
    gateway: GatewayProcess, store_redis: RedisProcess
) -> None:
    def store(client: httpx.Client, key: str, seed: int) -> str:
        body = {
            "model": MODEL_NAME,
            "input": long_text(seed, 60),  # about 4.5 kB, 1,100 tokens
            "max_output_tokens": 1,
            "temperature": 0,
        }
        created = client.post("/v1/responses", json=body, headers=headers(key))
        assert created.status_code == 200, created.text
        assert created.json()["store"] is True
        return str(created.json()["id"])

    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        kept = [store(client, KEY_B, seed) for seed in range(2)]
        mine = [store(client, KEY_A, seed) for seed in range(10, 16)]
        read_b = [client.get(f"/v1/responses/{i}", headers=headers(KEY_B)) for i in kept]
        read_a = [client.get(f"/v1/responses/{i}", headers=headers(KEY_A)) for i in mine]
    assert [r.status_code for r in read_b] == [200, 200]
    found = [r.status_code for r in read_a]
    # A's oldest went first, and only A's: a run of 404s, then the newest, which fit the bound.
    assert found == sorted(found, reverse=True) and found[0] == 404 and found[-2:] == [200, 200]
    server = redis.Redis(port=store_redis.port)
    base = f"{PREFIX}:responses:{{{key_id(KEY_A)}}}"
    ids = [i.decode() for i in server.zrange(f"{base}:ids", 0, -1)]
    assert ids == [i for i, status in zip(mine, found, strict=True) if status == 200]
    held = sum(server.strlen(f"{PREFIX}:response:{{{key_id(KEY_A)}}}:{i}") for i in ids)
    assert int(server.get(f"{base}:bytes") or 0) == held <= KEY_BOUND
    server.close()


def test_truncation_auto_stores_the_conversation_the_prompt_held(gateway: GatewayProcess) -> None:
    """Three long turns (about 3,300 tokens) in a 2,048-token window: what is stored is what
    was charged, counted again by the model's own template and tokenizer."""
    turns: list[dict[str, str]] = []
    for seed in range(3):
        turns += [
            {"role": "user", "content": long_text(seed, 45)},
            {"role": "assistant", "content": f"Noted, part {seed}."},
        ]
    turns.append({"role": "user", "content": "Which mill rose the most?"})
    body = {
        "model": MODEL_NAME,
        "input": turns,
        "truncation": "auto",
        "max_output_tokens": 2,
        "temperature": 0,
    }
    with httpx.Client(base_url=gateway.url, timeout=120, headers=headers(KEY_B)) as client:
        created = client.post("/v1/responses", json=body)
        assert created.status_code == 200, created.text
        assert created.headers["x-budget-truncation"] != "none"
        charged = created.json()["usage"]["input_tokens"]
        page = client.get(f"/v1/responses/{created.json()['id']}/input_items?order=asc&limit=100")
        items = page.json()["data"]
        messages = [
            {"role": i["role"], "content": "".join(p["text"] for p in i["content"])} for i in items
        ]
        assert messages[-1] == turns[-1]
        assert sum(len(m["content"]) for m in messages) < sum(len(t["content"]) for t in turns)
        counted = client.post("/tokenize", json={"model": MODEL_NAME, "messages": messages})
    assert counted.json()["count"] == charged
