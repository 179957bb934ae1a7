"""`/v1/embeddings`, `/v1/rerank` and `/v1/score` held as chat completions are: each API key's
share of the embedding engine (its own, in inputs), REQUEST_TIMEOUT and abort on disconnect
reaching the engine, the bound on an answer's values, and `/health` answered while a score of
2,047 documents is worked on (fake embedding engine, real loopback HTTP)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.engine.protocol import Embedding, Prompt
from tests.support.fakes import (
    FAKE_EMBEDDER,
    FakeEmbedder,
    chat_body,
    fake_app,
    health_silence,
    serve_in_thread,
)

EMBED = "/v1/embeddings"
KEY_A, KEY_B = "sk-embed-a-0123456789", "sk-embed-b-0123456789"
SLOW = "slowwords"
"""An input the held embedder waits on (its one token id is 9)."""
# How long a test waits for what follows at once (the engine call seen, cancelled): room for a
# loaded two-core machine, not a figure.
WAIT_S = 20.0


@dataclass
class HeldEmbedder(FakeEmbedder):
    """Holds every call with an input of `SLOW` until `release` is set."""

    release: threading.Event = field(default_factory=threading.Event)

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        if any(p.ids == [len(SLOW)] for p in prompts):
            self.calls.append(list(prompts))
            await asyncio.to_thread(self.release.wait)
            return [Embedding(self.vector(p.ids, dimensions), len(p.ids)) for p in prompts]
        return await super().embed(request_id, prompts, dimensions)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def wait_until(done: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_one_keys_embedding_backlog_does_not_hold_anothers() -> None:
    embedder = HeldEmbedder()
    app = fake_app(embedder=embedder, api_keys=f"{KEY_A},{KEY_B}", max_embedding_inputs_per_key=2)
    with serve_in_thread(app) as url, ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            httpx.post,
            f"{url}{EMBED}",
            json={"model": FAKE_EMBEDDER, "input": [SLOW, SLOW]},
            headers=bearer(KEY_A),
            timeout=60,
        )
        wait_until(lambda: embedder.calls, "the held request reached the engine")
        try:
            # Key A holds its whole share: its next requests are refused, not queued.
            more = {"model": FAKE_EMBEDDER, "input": "one"}
            again = httpx.post(f"{url}{EMBED}", json=more, headers=bearer(KEY_A), timeout=60)
            assert again.status_code == 429, again.text
            assert again.json()["error"]["code"] == "concurrency_limit_exceeded"
            assert again.headers["retry-after"] == "1"
            score = {"model": FAKE_EMBEDDER, "text_1": "a", "text_2": "b"}
            scored = httpx.post(f"{url}/v1/score", json=score, headers=bearer(KEY_A), timeout=60)
            assert scored.status_code == 429, scored.text
            # Key B's are answered meanwhile, and key A's chat completions (another share).
            other = httpx.post(f"{url}{EMBED}", json=more, headers=bearer(KEY_B), timeout=60)
            assert other.status_code == 200, other.text
            chat = httpx.post(
                f"{url}/v1/chat/completions", json=chat_body(), headers=bearer(KEY_A), timeout=60
            )
            assert chat.status_code == 200, chat.text
            assert not held.done()
            # A request larger than the whole share could never be taken: a 400.
            large = {"model": FAKE_EMBEDDER, "input": ["a", "b", "c"]}
            refused = httpx.post(f"{url}{EMBED}", json=large, headers=bearer(KEY_B), timeout=60)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "input"
        finally:
            embedder.release.set()
        assert held.result().status_code == 200
        # Its share came back.
        answer = httpx.post(f"{url}{EMBED}", json=more, headers=bearer(KEY_A), timeout=60)
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (EMBED, {"input": "one two"}),
        ("/v1/rerank", {"query": "a", "documents": ["b", "c"]}),
        ("/v1/score", {"text_1": "a", "text_2": ["b", "c"]}),
    ],
)
def test_an_embedding_past_request_timeout_is_a_504_and_aborts_the_engine_call(
    path: str, body: dict[str, object]
) -> None:
    embedder = FakeEmbedder(delay=60)
    with TestClient(fake_app(embedder=embedder, request_timeout=0.5)) as client:
        answer = client.post(path, json={"model": FAKE_EMBEDDER, **body})
    assert answer.status_code == 504, answer.text
    assert answer.json()["error"]["type"] == "timeout_error"
    assert embedder.cancelled == 1


def test_a_client_that_leaves_aborts_the_engine_call() -> None:
    embedder = FakeEmbedder(delay=60)
    with serve_in_thread(fake_app(embedder=embedder)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}{EMBED}", json={"model": FAKE_EMBEDDER, "input": "a"}, timeout=1)
        wait_until(lambda: embedder.cancelled == 1, "the engine call was not aborted")


def test_an_answer_of_more_values_than_the_bound_is_a_400() -> None:
    embedder = FakeEmbedder(size=8, matryoshka=True)
    with TestClient(fake_app(embedder=embedder, max_embedding_values=20)) as client:
        taken = client.post(EMBED, json={"model": FAKE_EMBEDDER, "input": ["a", "b"]})
        assert taken.status_code == 200, taken.text
        # The model's size is known once it answered: 3 inputs of 8 values pass 20.
        over = client.post(EMBED, json={"model": FAKE_EMBEDDER, "input": ["a", "b", "c"]})
        assert over.status_code == 400, over.text
        assert over.json()["error"]["param"] == "input"
        assert "20 values" in over.json()["error"]["message"]
        # With `dimensions`, before anything is computed.
        computed = len(embedder.calls)
        sent = {"model": FAKE_EMBEDDER, "input": ["a", "b", "c", "d", "e", "f"], "dimensions": 4}
        refused = client.post(EMBED, json=sent)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "dimensions"
        assert len(embedder.calls) == computed
        sent["input"] = ["a", "b", "c", "d", "e"]
        assert client.post(EMBED, json=sent).status_code == 200


# The longest /health may go unanswered while the score is worked on: a stall a user would
# see, with room for a loaded two-core machine.
STALL_BOUND_S = 2.0


def test_health_keeps_answering_while_a_score_of_2047_documents_is_worked_on() -> None:
    embedder = FakeEmbedder(size=4096, max_model_len=4096)
    documents = ["w" * (1 + i % 7) for i in range(2047)]  # few to compute, many to score
    body = {"model": FAKE_EMBEDDER, "text_1": "the query", "text_2": documents}
    with serve_in_thread(fake_app(embedder=embedder)) as url, health_silence(url) as silences:
        for _ in range(3):  # computed, then from the cache
            answer = httpx.post(f"{url}/v1/score", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
    scores = answer.json()["data"]
    assert len(scores) == 2047 and all(abs(s["score"]) <= 1 + 1e-9 for s in scores)
    assert silences and silences[0] <= STALL_BOUND_S, (
        f"/health went {silences[0]:.2f} s without an answer while a score of 2,047 "
        "documents was worked on: the event loop stalled"
    )
