"""Engine slots: the sequences one request may start, one key's share of those in flight,
and the engine priority: keys' ranks, fairness between keys, a request's own `priority`
(fake engine, real HTTP)."""

from __future__ import annotations

import hashlib
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.counters import LocalTally
from sluicegate.errors import ConcurrencyLimitError, InvalidRequestError
from sluicegate.keys import key_id
from sluicegate.quota.share import RANK_SPAN, KeyShare, SequenceShare
from sluicegate.settings import Settings
from sluicegate.wiring import embedding_share
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

KEY_A, KEY_B = "sk-share-a", "sk-share-b"
KEYS = f"{KEY_A},{KEY_B}"


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def completion(prompts: int, n: int) -> dict[str, object]:
    return {
        "model": FAKE_MODEL,
        "prompt": ["a b"] * prompts,
        "n": n,
        "temperature": 1,
        "max_tokens": 3,
    }


# ---- sequences per request ---------------------------------------------------------------


@pytest.mark.parametrize(("prompts", "n", "param"), [(3, 2, "n"), (5, 1, "prompt")])
def test_sequences_per_request_are_capped_naming_the_parameter(
    prompts: int, n: int, param: str
) -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine, max_sequences_per_request=4)) as client:
        response = client.post("/v1/completions", json=completion(prompts, n))
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
        assert "4" in error["message"]
        assert engine.requests == []
        assert client.post("/v1/completions", json=completion(2, 2)).status_code == 200


def test_chat_n_is_capped_by_the_sequences_per_request() -> None:
    with TestClient(fake_app(FakeEngine(), max_sequences_per_request=2)) as client:
        body = {
            "model": FAKE_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "n": 3,
            "temperature": 1,
        }
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "n"


# ---- one key's share of the engine -------------------------------------------------------


@pytest.fixture
def slow_engine() -> FakeEngine:
    return FakeEngine(words=["a", "b", "c"], delays=[0.0, 3.0, 0.0])


class Held:
    """A slow request of `key` in flight on a thread, until its engine run ends."""

    def __init__(self, url: str, key: str, body: dict[str, object]) -> None:
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(
            target=self._send, args=(url, key, body), daemon=True, name="held-request"
        )
        self._thread.start()

    def _send(self, url: str, key: str, body: dict[str, object]) -> None:
        headers = auth(key) if key else {}
        self.response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)

    def join(self) -> httpx.Response:
        self._thread.join(30)
        assert self.response is not None
        return self.response


def wait_for(engine: FakeEngine, active: int) -> None:
    deadline = time.monotonic() + 5
    while len(engine.active) < active:
        assert time.monotonic() < deadline, engine.active
        time.sleep(0.01)


def test_one_key_cannot_take_more_than_half_the_engine_by_default(slow_engine: FakeEngine) -> None:
    # MAX_NUM_SEQS=8: each key may hold 4 sequences in flight.
    app = fake_app(slow_engine, api_keys=KEYS, max_num_seqs=8)
    with serve_in_thread(app) as url:
        held = Held(url, KEY_A, completion(2, 2))
        wait_for(slow_engine, 2)
        refused = httpx.post(f"{url}/v1/completions", json=completion(1, 1), headers=auth(KEY_A))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        # Another key still gets its share.
        other = httpx.post(f"{url}/v1/completions", json=completion(2, 2), headers=auth(KEY_B))
        assert other.status_code == 200
        assert held.join().status_code == 200
        # The share comes back when the request ends.
        again = httpx.post(f"{url}/v1/completions", json=completion(2, 2), headers=auth(KEY_A))
        assert again.status_code == 200


def test_a_request_larger_than_the_share_is_a_400() -> None:
    with TestClient(fake_app(FakeEngine(), api_keys=KEYS, max_sequences_per_key=3)) as client:
        response = client.post("/v1/completions", json=completion(2, 2), headers=auth(KEY_A))
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "n"


def test_without_api_keys_there_is_no_share(slow_engine: FakeEngine) -> None:
    with serve_in_thread(fake_app(slow_engine, max_num_seqs=8)) as url:
        held = [Held(url, "", completion(2, 2)) for _ in range(3)]
        assert [h.join().status_code for h in held] == [200, 200, 200]


def test_the_share_setting_wins_over_the_default(slow_engine: FakeEngine) -> None:
    app = fake_app(slow_engine, api_keys=KEYS, max_num_seqs=8, max_sequences_per_key=6)
    with serve_in_thread(app) as url:
        held = Held(url, KEY_A, completion(2, 2))
        wait_for(slow_engine, 2)
        refused = httpx.post(f"{url}/v1/completions", json=completion(3, 1), headers=auth(KEY_A))
        assert refused.status_code == 429
        fits = httpx.post(f"{url}/v1/completions", json=completion(1, 2), headers=auth(KEY_A))
        assert fits.status_code == 200
        held.join()


def test_priority_scheduling_puts_busy_keys_behind(slow_engine: FakeEngine) -> None:
    app = fake_app(slow_engine, api_keys=KEYS, max_num_seqs=16, scheduling_policy="priority")
    with serve_in_thread(app) as url:
        held = Held(url, KEY_A, completion(2, 2))
        wait_for(slow_engine, 2)
        httpx.post(f"{url}/v1/completions", json=completion(1, 1), headers=auth(KEY_A))
        httpx.post(f"{url}/v1/completions", json=completion(1, 1), headers=auth(KEY_B))
        held.join()
    # Key A's first request ran at priority 0 (both prompts); its next one behind the 4
    # sequences it had in flight; key B's, with nothing in flight, at 0 again.
    assert slow_engine.priorities == [0, 0, 4, 0]


def test_first_come_first_served_passes_no_priority(slow_engine: FakeEngine) -> None:
    with serve_in_thread(fake_app(slow_engine, api_keys=KEYS, max_num_seqs=16)) as url:
        held = Held(url, KEY_A, completion(2, 2))
        wait_for(slow_engine, 2)
        httpx.post(f"{url}/v1/completions", json=completion(1, 1), headers=auth(KEY_A))
        held.join()
    assert slow_engine.priorities == [0, 0, 0]


def test_requests_that_follow_an_identical_run_hold_none_of_the_share(
    slow_engine: FakeEngine,
) -> None:
    """Single flight: identical requests share one engine run, so they must not use up the
    key's share of the engine while they wait for it."""
    app = fake_app(slow_engine, api_keys=KEYS, max_sequences_per_key=2, cache_flight_timeout=30)
    greedy = {**completion(1, 1), "temperature": 0}
    with serve_in_thread(app) as url:
        leader = Held(url, KEY_A, greedy)
        wait_for(slow_engine, 1)
        followers = [Held(url, KEY_A, greedy) for _ in range(4)]
        assert [f.join().status_code for f in followers] == [200] * 4
        assert leader.join().status_code == 200
    assert len(slow_engine.requests) == 1


# ---- key ranks and the request's own priority --------------------------------------------


def key_id_of(key: str) -> str:
    return key_id(hashlib.sha256(key.encode()).digest())


def test_a_keys_rank_comes_before_fairness_and_a_request_may_ask_to_go_later() -> None:
    engine = FakeEngine()
    app = fake_app(
        engine,
        api_keys=KEYS,
        scheduling_policy="priority",
        key_priorities={key_id_of(KEY_B): -1},
    )
    with TestClient(app) as client:
        for key, asked in ((KEY_A, 0), (KEY_B, 0), (KEY_A, 5), (KEY_B, 2)):
            body = {**completion(1, 1), "priority": asked}
            assert client.post("/v1/completions", json=body, headers=auth(key)).status_code == 200
        ahead = client.post(
            "/v1/completions", json={**completion(1, 1), "priority": -1}, headers=auth(KEY_A)
        )
    assert ahead.status_code == 400
    assert ahead.json()["error"]["param"] == "priority"
    assert "never ahead" in ahead.json()["error"]["message"]
    # Key B's rank (-1) puts each of its requests before any of key A's (rank 0).
    assert engine.priorities == [0, -RANK_SPAN, 5, -RANK_SPAN + 2]


def test_without_api_keys_any_priority_goes_to_the_engine_as_asked() -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine, scheduling_policy="priority")) as client:
        chat = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for asked in (-7, 3):
            response = client.post("/v1/chat/completions", json={**chat, "priority": asked})
            assert response.status_code == 200
    assert engine.priorities == [-7, 3]


def test_first_come_first_served_refuses_a_priority_as_vllms_server_does() -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine)) as client:
        zero = client.post("/v1/completions", json={**completion(1, 1), "priority": 0})
        assert zero.status_code == 200
        refused = client.post("/v1/completions", json={**completion(1, 1), "priority": 3})
        too_big = client.post("/v1/completions", json={**completion(1, 1), "priority": 2**31})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "priority"
    assert len(engine.requests) == 1


def test_embedding_inputs_are_a_share_of_their_own_on_the_same_tally() -> None:
    tally = LocalTally()
    sequences = SequenceShare(per_key=2, tally=tally)
    inputs = KeyShare(per_key=3, tally=tally)
    assert sequences.take("key-a", 2, "n") == 0
    assert inputs.take_some("key-a", 3, "input") == 0  # not held back by the sequences
    with pytest.raises(ConcurrencyLimitError, match="3 inputs being embedded in flight"):
        inputs.check("key-a")
    inputs.check("key-b")
    with pytest.raises(InvalidRequestError, match="at most 3 in flight") as larger:
        inputs.take_some("key-b", 4, "input")
    assert larger.value.param == "input"
    inputs.give_back("key-a", 3)
    assert inputs.in_flight("key-a") == 0 and sequences.in_flight("key-a") == 2


@pytest.mark.parametrize(
    ("settings", "per_key"),
    [
        ({}, None),
        ({"api_keys": KEYS}, 4096),
        ({"api_keys": KEYS, "max_embedding_inputs_per_key": 10}, 10),
    ],
)
def test_the_embedding_share_is_4096_inputs_with_keys_unless_set(
    settings: dict[str, object], per_key: int | None
) -> None:
    config = Settings(_env_file=None, **settings)  # type: ignore[arg-type]
    assert embedding_share(config).per_key == per_key
