"""`GET` and `PUT /admin/admission` over the fake engine: who may, what is refused, and that a
change is what the next requests are admitted by, as the settings would have them, with the
requests already admitted left to finish; and `POST /admin/admission/reset`, what the TTFT
estimate measured forgotten."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.engine.protocol import EngineLoad, EngineStep
from sluicegate.keys import digest_of, key_id
from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, fake_app, serve_in_thread
from tests.support.metrics import parse, value

ADMIN = "sk-admin-0123456789"
USER = "sk-user-0123456789"
KEYED = {"api_keys": USER, "admin_api_keys": ADMIN}
LOGGER = "sluicegate.inference.admission"
ADMISSION, CHAT = "/admin/admission", "/v1/chat/completions"
REFUSED = "sluicegate_admission_refused_total"
REASONS = ("engine_waiting", "kv_cache", "engine_running")
UNSET = {
    "ttft_objective": None,
    "max_engine_waiting": None,
    "max_engine_running": None,
    "max_kv_cache_usage": None,
}
SAFETY_S = 30.0
"""How long the test waiting on a held request may take before it fails instead of hanging:
a bound on a hang, not on performance (it takes well under a second)."""


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(fake_app(FakeEngine(), allow_runtime_admission=True)) as client:
        yield client


# ---- who may ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "headers"), [({}, {}), (KEYED, bearer(USER)), (KEYED, bearer(ADMIN))]
)
def test_off_by_default_the_routes_answer_404_naming_the_setting(
    keys: dict[str, Any], headers: dict[str, str]
) -> None:
    """Whoever asks with a valid key (a request without one is refused before any route
    when keys are set, as on every path)."""
    with TestClient(fake_app(FakeEngine(), **keys)) as client:
        for answer in (
            client.get(ADMISSION, headers=headers),
            client.put(ADMISSION, json={"ttft_objective": 1.0}, headers=headers),
        ):
            assert answer.status_code == 404, answer.text
            error = answer.json()["error"]
            assert error["code"] == "not_found"
            assert "SLUICEGATE_ALLOW_RUNTIME_ADMISSION" in error["message"]


def test_with_api_keys_only_admin_keys_may_read_or_change_the_bounds() -> None:
    app = fake_app(FakeEngine(), api_keys=USER, admin_api_keys=ADMIN, allow_runtime_admission=True)
    change = {"max_engine_running": 4}
    with TestClient(app) as client:
        assert client.get(ADMISSION).status_code == 401
        assert client.put(ADMISSION, json=change).status_code == 401
        for answer in (
            client.get(ADMISSION, headers=bearer(USER)),
            client.put(ADMISSION, json=change, headers=bearer(USER)),
        ):
            assert answer.status_code == 403
            assert answer.json()["error"]["code"] == "permission_denied"
        assert client.get(ADMISSION, headers=bearer(ADMIN)).json() == UNSET  # nothing changed
        assert client.put(ADMISSION, json=change, headers=bearer(ADMIN)).status_code == 200
        shown = client.get(ADMISSION, headers=bearer(ADMIN)).json()
        assert shown["max_engine_running"] == 4


# ---- what a change is -------------------------------------------------------------------


def test_get_shows_the_settings_bounds_at_start() -> None:
    app = fake_app(
        FakeEngine(), allow_runtime_admission=True, ttft_objective=2.5, max_engine_waiting=0
    )
    with TestClient(app) as client:
        assert client.get(ADMISSION).json() == {
            **UNSET,
            "ttft_objective": 2.5,
            "max_engine_waiting": 0,
        }


def test_a_field_sent_sets_null_unsets_and_absent_keeps(client: TestClient) -> None:
    first = {"ttft_objective": 1.5, "max_engine_running": 8, "max_kv_cache_usage": 0.9}
    answered = client.put(ADMISSION, json=first)
    assert answered.status_code == 200, answered.text
    assert answered.json() == {**UNSET, **first}
    changed = client.put(ADMISSION, json={"max_engine_running": None, "max_engine_waiting": 3})
    expected = {**UNSET, "ttft_objective": 1.5, "max_engine_waiting": 3, "max_kv_cache_usage": 0.9}
    assert changed.json() == expected
    assert client.get(ADMISSION).json() == expected
    # GET's answer sent back changes nothing; an empty body neither.
    assert client.put(ADMISSION, json=expected).json() == expected
    assert client.put(ADMISSION, json={}).json() == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"ttft_objective": 0}, "ttft_objective"),
        ({"ttft_objective": -1.0}, "ttft_objective"),
        ({"ttft_objective": "2"}, "ttft_objective"),
        ({"max_engine_waiting": -1}, "max_engine_waiting"),
        ({"max_engine_running": 0}, "max_engine_running"),
        ({"max_engine_running": 2.5}, "max_engine_running"),
        ({"max_engine_running": True}, "max_engine_running"),
        ({"max_kv_cache_usage": 1.01}, "max_kv_cache_usage"),
        ({"max_kv_cache_usage": 0}, "max_kv_cache_usage"),
        ({"max_running": 4}, "max_running"),
    ],
)
def test_a_bad_value_or_unknown_field_is_a_400_naming_it_and_changes_nothing(
    client: TestClient, body: dict[str, Any], param: str
) -> None:
    client.put(ADMISSION, json={"max_engine_running": 6})
    refused = client.put(ADMISSION, json={"max_engine_waiting": 2, **body})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert client.get(ADMISSION).json() == {**UNSET, "max_engine_running": 6}


@pytest.mark.parametrize("content", [b'{"ttft_objective": Infinity}', b"[1]", b"{not json"])
def test_a_body_that_is_no_finite_object_is_a_400(client: TestClient, content: bytes) -> None:
    headers = {"content-type": "application/json"}
    refused = client.put(ADMISSION, content=content, headers=headers)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert client.get(ADMISSION).json() == UNSET


def test_a_change_is_logged_with_the_admin_keys_id_and_never_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = fake_app(FakeEngine(), api_keys=USER, admin_api_keys=ADMIN, allow_runtime_admission=True)
    with (
        TestClient(app) as client,
        caplog.at_level(logging.INFO, logger=LOGGER),
    ):
        client.put(ADMISSION, json={"ttft_objective": 2.0}, headers=bearer(ADMIN))
        client.put(ADMISSION, json={"ttft_objective": 1.0}, headers=bearer(ADMIN))
    changes = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    admin = key_id(digest_of(ADMIN))
    assert changes == [
        f"admission bounds changed by {admin}: ttft_objective None -> 2.0",
        f"admission bounds changed by {admin}: ttft_objective 2.0 -> 1.0",
    ]
    assert not any(ADMIN in r.getMessage() or USER in r.getMessage() for r in caplog.records)


# ---- what the next requests are admitted by ---------------------------------------------


def test_lowered_engine_bounds_refuse_as_the_settings_would() -> None:
    """As `test_load_limits.test_through_the_app_a_full_engine_refuses_before_any_engine_work`,
    with the bounds set at run time instead of at start; then unset, the same load is let in."""
    engine = FakeEngine()
    with TestClient(fake_app(engine, allow_runtime_admission=True)) as client:
        before = parse(client.get("/metrics").text)
        engine.engine_load = EngineLoad(waiting=2, running=3, kv_cache_usage=0.2)
        assert client.post(CHAT, json=chat_body("one")).status_code == 200  # no bound yet
        client.put(ADMISSION, json={"max_engine_waiting": 2, "max_kv_cache_usage": 0.9})
        refused = client.post(CHAT, json=chat_body("two", stream=True))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        engine.engine_load = EngineLoad(waiting=0, running=3, kv_cache_usage=0.95)
        full = client.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "a"})
        assert full.status_code == 503
        client.put(ADMISSION, json={"max_kv_cache_usage": None})
        assert client.post(CHAT, json=chat_body("three")).status_code == 200
        client.put(ADMISSION, json={"max_engine_running": 3})
        assert client.post(CHAT, json=chat_body("four")).status_code == 503
        after = parse(client.get("/metrics").text)
    assert len(engine.requests) == 2
    counted = [value(after, REFUSED, reason=r) - value(before, REFUSED, reason=r) for r in REASONS]
    assert counted == [1, 1, 1]


def test_a_lowered_ttft_objective_refuses_on_what_was_measured_before_it() -> None:
    """As `test_prefill_queue.test_through_the_app_a_late_first_token_is_a_503_and_a_stream_too`,
    the objective set at run time: the drain rate measured without one counts at once."""
    engine = FakeEngine(delays=[0.05, 0.0])
    with TestClient(fake_app(engine, allow_runtime_admission=True, cache_policy="off")) as client:
        for _ in range(9):  # no objective: all admitted, the rate measured all the same
            assert client.post(CHAT, json=chat_body()).status_code == 200
        client.put(ADMISSION, json={"ttft_objective": 0.01})
        refused = client.post(CHAT, json=chat_body())
        assert refused.status_code == 503, refused.text
        assert "0.01 s objective" in refused.json()["error"]["message"]
        assert client.post(CHAT, json=chat_body(stream=True)).status_code == 503
        client.put(ADMISSION, json={"ttft_objective": None})
        assert client.post(CHAT, json=chat_body()).status_code == 200
    assert len(engine.requests) == 10  # the refused runs never reached the engine


# ---- the requests already admitted ------------------------------------------------------


@dataclass
class HeldEngine(FakeEngine):
    """The fake engine, whose runs wait for `release` (set from the test's thread) before
    their first word; `entered` is set when the first one does."""

    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    held: int = 0

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[EngineStep]:
        self.held += 1
        self.entered.set()
        await asyncio.to_thread(self.release.wait)
        async for step in super().generate(*args, **kwargs):
            yield step


async def test_a_request_waiting_through_a_lowered_then_unset_bound_finishes() -> None:
    """A request admitted and waiting for its first token while its bounds are lowered past
    it, then unset, is neither refused nor held by them: it finishes once the engine goes on,
    its place in the queue freed, and the next request is admitted."""
    engine = HeldEngine(engine_load=EngineLoad(waiting=0, running=0, kv_cache_usage=0.1))
    app = fake_app(engine, allow_runtime_admission=True, cache_policy="off")
    try:
        with serve_in_thread(app) as url:
            async with (
                httpx.AsyncClient(base_url=url, timeout=SAFETY_S) as http,
                asyncio.timeout(SAFETY_S),
            ):
                waiting = asyncio.create_task(http.post(CHAT, json=chat_body("held")))
                assert await asyncio.to_thread(engine.entered.wait, SAFETY_S)
                engine.engine_load = EngineLoad(waiting=1, running=0, kv_cache_usage=0.1)
                lowered = {"max_engine_waiting": 1, "ttft_objective": 0.001}
                assert (await http.put(ADMISSION, json=lowered)).status_code == 200
                refused = await http.post(CHAT, json=chat_body("refused"))
                assert refused.status_code == 503, refused.text
                assert (await http.put(ADMISSION, json=UNSET)).status_code == 200
                assert not waiting.done()
                engine.release.set()
                finished = await waiting
                assert finished.status_code == 200, finished.text
                assert finished.json()["choices"][0]["message"]["content"] == "Hello there!"
                assert (await http.post(CHAT, json=chat_body("next"))).status_code == 200
                # The held request's place in the queue is free: nothing waits.
                samples = parse((await http.get("/metrics")).text)
                assert value(samples, "sluicegate_prefill_queue_tokens") == 0
    finally:
        engine.release.set()
    assert engine.held == 2  # the held request and the next; the refused one never came


# ---- measurements forgotten -------------------------------------------------------------


def test_reset_forgets_what_the_queue_measured_and_keeps_the_bounds() -> None:
    """Eight slow first tokens teach the estimate that a run misses a 0.01 s objective; after
    `POST /admin/admission/reset` the next runs are admitted as on a new engine (until eight
    departures are measured again), the bounds unchanged. Admin keys only, and 404 with
    runtime admission off, as the other two routes."""
    engine = FakeEngine(delays=[0.05, 0.0])
    app = fake_app(engine, api_keys=USER, admin_api_keys=ADMIN, allow_runtime_admission=True)
    admin, user = bearer(ADMIN), bearer(USER)
    with TestClient(app) as client:
        client.put(ADMISSION, json={"ttft_objective": 0.01}, headers=admin)
        for _ in range(8):
            assert client.post(CHAT, json=chat_body("a"), headers=user).status_code == 200
        assert client.post(CHAT, json=chat_body("b"), headers=user).status_code == 503
        assert rate(client, admin) > 0
        assert client.post(ADMISSION + "/reset", headers=user).status_code == 403
        assert rate(client, admin) > 0
        reset = client.post(ADMISSION + "/reset", headers=admin)
        assert reset.status_code == 200, reset.text
        assert reset.json() == {**UNSET, "ttft_objective": 0.01}
        assert rate(client, admin) == 0  # no rate to refuse by
        assert client.post(CHAT, json=chat_body("c"), headers=user).status_code == 200
        assert client.get(ADMISSION, headers=admin).json() == {**UNSET, "ttft_objective": 0.01}
    assert len(engine.requests) == 9
    with TestClient(fake_app(FakeEngine())) as client:
        assert client.post(ADMISSION + "/reset").status_code == 404


def rate(client: TestClient, key: str) -> float:
    """The drain rate the TTFT estimate divides by, as `/metrics` shows it."""
    exposition = parse(client.get("/metrics", headers=bearer(key)).text)
    return value(exposition, "sluicegate_prefill_rate_tokens_per_second")
