"""API keys, over the app with the fake engine."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sluicegate.keys import ApiKeyError, ApiKeyring, key_id
from sluicegate.settings import Settings, describe_error
from tests.fakes import FAKE_MODEL, fake_app

MODEL = FAKE_MODEL
GOOD = "sk-good-0123456789"
OTHER = "sk-other-abcdef"


def make_client(**settings: object) -> TestClient:
    return TestClient(fake_app(**settings))


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(api_keys=f"{GOOD},sha256:{hashlib.sha256(OTHER.encode()).hexdigest()}") as c:
        yield c


def every_route(client: TestClient) -> list[tuple[str, str]]:
    routes = [
        (method, route.path.replace("{model:path}", MODEL))  # type: ignore[attr-defined]
        for route in client.app.routes  # type: ignore[attr-defined]
        for method in sorted(getattr(route, "methods", None) or ["GET"])
        if method != "HEAD"
    ]
    return [*routes, ("GET", "/no/such/path"), ("DELETE", "/v1/models")]


BAD_HEADERS = [
    {},
    {"authorization": "Bearer sk-wrong"},
    {"authorization": f"Basic {GOOD}"},
    {"authorization": "Bearer"},
    {"authorization": GOOD},
    {"authorization": f"Bearer {GOOD}x"},
]


@pytest.mark.parametrize("headers", BAD_HEADERS)
def test_every_route_but_health_and_ready_needs_a_key(
    client: TestClient, headers: dict[str, str]
) -> None:
    reference = None
    for method, path in every_route(client):
        response = client.request(method, path, headers=headers, json={})
        if path in ("/health", "/ready", "/metrics"):
            assert response.status_code == 200, path
            continue
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"] == "Bearer"
        assert "x-request-id" in response.headers
        if reference is None:
            reference = response.content
        assert response.content == reference, "every refusal looks the same"
    assert reference is not None
    assert b'"code": "invalid_api_key"' in reference


def test_a_plain_or_hashed_key_opens_the_api(client: TestClient) -> None:
    for key in (GOOD, OTHER):
        response = client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200
        chat = client.post(
            "/v1/chat/completions",
            headers={"authorization": f"bearer {key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 200


def test_metrics_can_require_the_key() -> None:
    with make_client(api_keys=GOOD, metrics_require_auth=True) as client:
        assert client.get("/metrics").status_code == 401
        ok = client.get("/metrics", headers={"authorization": f"Bearer {GOOD}"})
        assert ok.status_code == 200
        assert client.get("/health").status_code == 200


def test_without_keys_everything_is_open() -> None:
    with make_client() as client:
        assert client.get("/v1/models").status_code == 200


def test_keys_from_a_file_with_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    digest = hashlib.sha256(b"k2").hexdigest()
    path.write_text(f"# team a\nk1\n\nsha256:{digest}  # team b\n")
    ring = ApiKeyring.parse(f"@{path}")
    assert ring.identify("k1") == key_id(hashlib.sha256(b"k1").digest())
    assert ring.identify("k2") == "key-" + digest[:12]
    assert ring.identify("k3") is None
    assert ring.identify("") is None


@pytest.mark.parametrize("value", ["", " , ", "sha256:1234", "@/no/such/file"])
def test_unusable_key_settings_are_refused(value: str) -> None:
    with pytest.raises(ApiKeyError):
        ApiKeyring.parse(value)


def test_keys_never_appear_in_settings_output_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(api_keys=GOOD, _env_file=None)  # type: ignore[call-arg]
    assert GOOD not in repr(settings) and GOOD not in str(settings.model_dump())
    with pytest.raises(ValidationError) as caught:
        Settings(api_keys=f"{GOOD},sha256:nothex", _env_file=None)  # type: ignore[call-arg]
    message = describe_error(caught.value)
    assert "SLUICEGATE_API_KEYS" in message and GOOD not in message
    caplog.set_level(logging.DEBUG)
    with make_client(api_keys=GOOD) as client:
        client.get("/v1/models", headers={"authorization": f"Bearer {GOOD}"})
        client.get("/v1/models", headers={"authorization": "Bearer sk-wrong"})
    assert GOOD not in caplog.text and "sk-wrong" not in caplog.text
