"""CORS over the real app with the fake engine (no vLLM): preflights, refusals, exposed headers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sluicegate.settings import Settings
from tests.support.fakes import FAKE_MODEL, fake_app

PAGE = "http://127.0.0.1:5173"
OTHER = "http://evil.example:5173"
KEY = "sk-cors-test"
CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = fake_app(cors_allow_origins=f"{PAGE}, https://app.example", api_keys=KEY)
    with TestClient(app) as test_client:
        yield test_client


def preflight(client: TestClient, origin: str, headers: str = "authorization,content-type"):  # type: ignore[no-untyped-def]
    return client.options(
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": headers,
        },
    )


def test_a_preflight_is_answered_without_a_key(client: TestClient) -> None:
    response = preflight(client, PAGE, "authorization,content-type,x-stainless-os")
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == PAGE
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed = response.headers["access-control-allow-headers"].lower()
    assert {"authorization", "content-type", "x-stainless-os"} <= set(allowed.split(","))
    assert "access-control-allow-credentials" not in response.headers


def test_a_preflight_from_an_origin_not_allowed_is_refused(client: TestClient) -> None:
    response = preflight(client, OTHER)
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers


def test_a_401_carries_the_cors_headers_so_a_page_can_read_it(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": PAGE})
    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == PAGE
    assert response.json()["error"]["code"] == "invalid_api_key"
    exposed = response.headers["access-control-expose-headers"].lower().split(", ")
    assert "x-request-id" in exposed


def test_an_answer_exposes_request_id_cache_and_budget_headers(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"Origin": PAGE, "Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == PAGE
    exposed = set(response.headers["access-control-expose-headers"].lower().split(", "))
    assert {"x-request-id", "x-cache", "age", "retry-after"} <= exposed
    budget = {h.lower() for h in response.headers if h.lower().startswith("x-budget-")}
    assert budget and budget <= exposed
    assert "x-ratelimit-remaining-tokens" in exposed


def test_an_origin_not_allowed_gets_no_cors_headers(client: TestClient) -> None:
    response = client.get("/v1/models", headers={"Origin": OTHER, "Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200  # the server answers; the browser withholds it
    assert "access-control-allow-origin" not in response.headers


def test_without_origins_there_is_no_cors() -> None:
    with TestClient(fake_app()) as client:
        response = preflight(client, PAGE)
        assert "access-control-allow-origin" not in response.headers
        assert response.status_code == 405


@pytest.mark.parametrize("value", ["example.com", "http://a.example/path", "ftp://a.example"])
def test_a_value_that_is_not_an_origin_is_refused_at_start(value: str) -> None:
    with pytest.raises(ValidationError, match="is not an origin"):
        Settings(cors_allow_origins=value, _env_file=None)  # type: ignore[call-arg]


def test_origins_are_listed_without_trailing_slashes() -> None:
    settings = Settings(cors_allow_origins="http://[::1]:8080/, *", _env_file=None)  # type: ignore[call-arg]
    assert settings.cors_origins == ["http://[::1]:8080", "*"]
