"""Many models behind one endpoint, over fake engines (one in process, two standing in for
pools of upstreams): routing by name and alias, and fallbacks taken before the first byte,
never after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.errors import (
    BadGatewayError,
    EngineUnavailableError,
    GatewayError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
)
from tests.support.fakes import FakeEngine, fake_app, models_file, serve_in_thread
from tests.support.metrics import local_value
from tests.support.replicas import auth, create_key, replica

CHAT = "/v1/chat/completions"
MODELS = """
models:
  - name: primary
    aliases: [default, gpt-4o-mini]
    upstreams: [{url: "http://primary.test/v1"}]
    fallbacks: [backup]
  - name: backup
    upstreams: [{url: "http://backup.test/v1"}]
    fallbacks: [local]
  - name: local
    engine: local
  - name: limited
    upstreams: [{url: "http://limited.test/v1"}]
    rate_limit: {requests_per_minute: 1}
    fallbacks: [backup]
"""


class Fleet:
    def __init__(self, tmp_path: Path) -> None:
        self.primary = FakeEngine(words=["from", " primary"])
        self.backup = FakeEngine(words=["from", " backup"], max_model_len=4096)
        self.limited = FakeEngine(words=["from", " limited"])
        self.local = FakeEngine(words=["from", " local"], max_model_len=4096)
        pools = {
            "http://primary.test/v1": self.primary,
            "http://backup.test/v1": self.backup,
            "http://limited.test/v1": self.limited,
        }
        app = fake_app(self.local, pools=pools, models_file=models_file(tmp_path, MODELS))
        self.client = TestClient(app)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path)
    with fleet.client:
        yield fleet


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def fallbacks(reason: str, model: str = "primary", fallback: str = "backup") -> float:
    return local_value(
        "sluicegate_model_fallbacks_total", model=model, fallback=fallback, reason=reason
    )


def test_a_request_goes_to_the_model_it_names_or_aliases(fleet: Fleet) -> None:
    for name in ("primary", "default", "gpt-4o-mini"):
        response = fleet.client.post(CHAT, json=chat(name))
        assert response.status_code == 200, response.text
        body = response.json()
        # The entry's name, never the alias (as OpenAI answers a dated name for an alias).
        assert body["model"] == "primary"
        assert body["choices"][0]["message"]["content"] == "from primary"
        assert "x-sluicegate-fallback" not in response.headers
    answer = fleet.client.post(CHAT, json=chat("local")).json()
    assert answer["model"] == "local" and answer["choices"][0]["message"]["content"] == "from local"
    assert len(fleet.primary.requests) == 3 and len(fleet.local.requests) == 1
    assert fleet.backup.requests == []


def test_an_unknown_model_is_model_not_found(fleet: Fleet) -> None:
    response = fleet.client.post(CHAT, json=chat("gpt-5"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_models_lists_every_name_and_alias(fleet: Fleet) -> None:
    cards = {c["id"]: c for c in fleet.client.get("/v1/models").json()["data"]}
    assert set(cards) == {"primary", "default", "gpt-4o-mini", "backup", "local", "limited"}
    assert fleet.client.get("/v1/models/default").json()["id"] == "default"
    assert fleet.client.get("/v1/models/nope").status_code == 404


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (EngineUnavailableError("No upstream is available."), "unavailable"),
        (OverloadedError(), "overloaded"),
        (RateLimitError("The upstream is rate limiting."), "rate_limited"),
        (BadGatewayError(), "upstream_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_model_that_fails_before_its_first_byte_hands_over_to_its_fallback(
    fleet: Fleet, error: GatewayError, reason: str, stream: bool
) -> None:
    fleet.primary.fail_before_output = error
    before = fallbacks(reason)
    response = fleet.client.post(CHAT, json=chat("default", stream=stream))
    assert response.status_code == 200, response.text
    assert response.headers["x-sluicegate-fallback"] == "primary"
    if stream:
        assert '"model":"backup"' in response.text and "from" in response.text
    else:
        body = response.json()
        assert body["model"] == "backup"
        assert body["choices"][0]["message"]["content"] == "from backup"
    assert fallbacks(reason) == before + 1
    assert len(fleet.primary.requests) == 1 and len(fleet.backup.requests) == 1


def test_fallbacks_go_on_down_the_chain(fleet: Fleet) -> None:
    fleet.primary.fail_before_output = EngineUnavailableError()
    fleet.backup.fail_before_output = EngineUnavailableError()
    body = fleet.client.post(CHAT, json=chat("primary")).json()
    assert body["model"] == "local"
    assert fallbacks("unavailable", "backup", "local") >= 1


def test_when_every_model_fails_the_last_ones_error_is_the_answer(fleet: Fleet) -> None:
    fleet.backup.fail_before_output = EngineUnavailableError("backup down")
    fleet.local.fail_before_output = OverloadedError("local full")
    response = fleet.client.post(CHAT, json=chat("backup"))
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "local full"


def test_a_prompt_over_the_models_window_goes_to_a_fallback_with_room(fleet: Fleet) -> None:
    long = " ".join(["word"] * 200)  # 200 tokens: over primary's 64, within backup's 4096
    body = chat("primary", truncation="disabled")
    body["messages"][0]["content"] = long
    response = fleet.client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "backup"
    assert fleet.primary.requests == []  # refused by its budget, before its engine


def test_a_failure_after_the_first_byte_is_never_handed_over(fleet: Fleet) -> None:
    fleet.primary.fail_after_words = 1
    response = fleet.client.post(CHAT, json=chat("primary", stream=True))
    assert response.status_code == 200
    assert '"engine_unavailable"' in response.text  # the error event, then [DONE]
    assert "x-sluicegate-fallback" not in response.headers
    assert fleet.backup.requests == []


def test_a_refusal_of_the_request_itself_is_not_handed_over(fleet: Fleet) -> None:
    fleet.primary.fail_before_output = InvalidRequestError("bad stop sequence")
    response = fleet.client.post(CHAT, json=chat("primary"))
    assert response.status_code == 400
    assert fleet.backup.requests == []


def test_a_models_own_rate_limit_hands_over_to_its_fallback(fleet: Fleet) -> None:
    first = fleet.client.post(CHAT, json=chat("limited"))
    assert first.json()["model"] == "limited"
    second = fleet.client.post(CHAT, json=chat("limited"))
    assert second.status_code == 200
    assert second.json()["model"] == "backup"
    assert second.headers["x-sluicegate-fallback"] == "limited"


def test_the_answering_model_labels_the_request_metrics(fleet: Fleet) -> None:
    fleet.primary.fail_before_output = EngineUnavailableError()
    labels = {"endpoint": CHAT, "status": "200"}
    before = local_value("sluicegate_requests_total", model="backup", **labels)
    fleet.client.post(CHAT, json=chat("primary"))
    assert local_value("sluicegate_requests_total", model="backup", **labels) == before + 1
    # Nothing stays in flight for either model.
    assert local_value("sluicegate_requests_in_flight", model="primary") == 0
    assert local_value("sluicegate_requests_in_flight", model="backup") == 0


def test_a_keys_models_list_holds_for_its_fallbacks_too(tmp_path: Path, prefix: str) -> None:
    """A key limited to `primary` and `local` asks `primary`, which is down: `backup`, not the
    key's, is passed over, and `local` (backup's fallback, the key's) answers."""
    primary = FakeEngine(fail_before_output=EngineUnavailableError())
    backup = FakeEngine(words=["from", " backup"])
    local = FakeEngine(words=["from", " local"], max_model_len=4096)
    pools = {"http://primary.test/v1": primary, "http://backup.test/v1": backup}
    pools["http://limited.test/v1"] = FakeEngine()
    models = models_file(tmp_path, MODELS)
    app = replica(prefix, engine=local, pools=pools, models_file=models)
    with serve_in_thread(app) as url:
        key = create_key(url, models=["primary", "local"])["key"]
        answer = httpx.post(f"{url}{CHAT}", json=chat("primary"), headers=auth(key), timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "local"
        assert backup.requests == []
        local.fail_before_output = EngineUnavailableError("local down")
        refused = httpx.post(f"{url}{CHAT}", json=chat("primary"), headers=auth(key), timeout=10)
        assert refused.status_code == 503 and backup.requests == []
        # A key with backup in its list is answered by it, as before.
        wider = create_key(url, models=["primary", "backup"])["key"]
        answer = httpx.post(f"{url}{CHAT}", json=chat("primary"), headers=auth(wider), timeout=10)
        assert answer.json()["model"] == "backup"


PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def with_image() -> dict[str, Any]:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": PIXEL}}]
    return {"model": "primary", "messages": [{"role": "user", "content": parts}]}


def test_a_fallback_that_reads_text_only_is_passed_over_for_images(fleet: Fleet) -> None:
    """primary reads images and fails; backup reads text only and is passed over; local (the
    last) reads images and answers. Without local, primary's error is the answer."""
    fleet.primary.takes_images = fleet.local.takes_images = True
    fleet.primary.fail_before_output = EngineUnavailableError("primary down")
    response = fleet.client.post(CHAT, json=with_image())
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "local"
    assert fleet.backup.requests == [] and len(fleet.local.prompts[0].images) == 1
    fleet.local.takes_images = False
    response = fleet.client.post(CHAT, json=with_image())
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "primary down"
    # The model asked for reads text only: its own refusal is the answer.
    fleet.primary.takes_images = False
    response = fleet.client.post(CHAT, json=with_image())
    assert response.status_code == 400
    assert "takes text only" in response.json()["error"]["message"]
