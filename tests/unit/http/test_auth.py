"""API keys, over the app with the fake engine."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from sluicegate.http.auth import ApiKeyMiddleware
from sluicegate.keys import ApiKeyError, ApiKeyring, key_id
from sluicegate.paths import ANTHROPIC_PATHS
from sluicegate.settings import Settings, describe_error
from tests.support.fakes import FAKE_MODEL, fake_app

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
def test_every_route_but_the_probes_and_the_playground_needs_a_key(
    client: TestClient, headers: dict[str, str]
) -> None:
    references: dict[bool, bytes] = {}
    for method, path in [*every_route(client), ("GET", "/playgroundx"), ("GET", "/playground/")]:
        response = client.request(method, path, headers=headers, json={})
        if path in (
            "/health",
            "/ready",
            "/metrics",
            "/metrics/engine",
            "/playground",
            "/playground/",
        ):
            assert response.status_code == 200, path
            continue
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"] == "Bearer"
        assert "x-request-id" in response.headers
        # The same everywhere, in the envelope of the API the path belongs to.
        reference = references.setdefault(path in ANTHROPIC_PATHS, response.content)
        assert response.content == reference, "every refusal looks the same"
    assert b'"code": "invalid_api_key"' in references[False]
    assert b'"type": "authentication_error"' in references[True]


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
        for path in ("/metrics", "/metrics/engine"):
            assert client.get(path).status_code == 401
            ok = client.get(path, headers={"authorization": f"Bearer {GOOD}"})
            assert ok.status_code == 200
        assert client.get("/health").status_code == 200


def test_without_keys_everything_is_open() -> None:
    with make_client() as client:
        assert client.get("/v1/models").status_code == 200


def test_keys_from_a_file_with_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    digest = hashlib.sha256(b"k2").hexdigest()
    path.write_text(f"# team a\nk1\n\n  # team b\nsha256:{digest}\nk#3\n")
    ring = ApiKeyring.parse(f"@{path}")
    assert ring.identify("k1") == key_id(hashlib.sha256(b"k1").digest())
    assert ring.identify("k2") == "key-" + digest[:12]
    assert ring.identify("k#3") == key_id(hashlib.sha256(b"k#3").digest())
    assert ring.identify("k") is None
    assert ring.identify("k3") is None
    assert ring.identify("") is None
    assert len(ring.digests) == 3


def test_a_hash_sign_inside_a_line_is_part_of_the_key(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-a#b\n\t# only a comment\n")
    ring = ApiKeyring.parse(f"@{path}")
    assert ring.identify("sk-a#b") is not None
    assert ring.identify("sk-a") is None
    assert ring.identify("# only a comment") is None


EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


def test_an_empty_bearer_token_never_matches_whatever_the_keyring_holds() -> None:
    ring = ApiKeyring((hashlib.sha256(b"").digest(),))  # as if parsing had let it through
    assert ring.identify("") is None
    app = ApiKeyMiddleware(_never_called, ring, frozenset())
    for headers in ([], [(b"authorization", b"Bearer ")], [(b"authorization", b"Bearer   ")]):
        assert _status(app, headers) == 401


@pytest.mark.parametrize(
    "value",
    [f"sha256:{EMPTY_DIGEST}", f"sk-fine,sha256:{EMPTY_DIGEST.upper()}"],
)
def test_the_digest_of_the_empty_string_is_refused_at_start_up(value: str) -> None:
    with pytest.raises(ApiKeyError, match="empty"):
        ApiKeyring.parse(value)
    with pytest.raises(ValidationError) as caught:
        Settings(api_keys=value, _env_file=None)  # type: ignore[call-arg]
    message = describe_error(caught.value)
    assert message.startswith("invalid setting SLUICEGATE_API_KEYS:") and "empty" in message


def test_the_empty_digest_is_refused_in_a_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"sk-fine\nsha256:{EMPTY_DIGEST}\n")
    with pytest.raises(ApiKeyError, match="empty"):
        ApiKeyring.parse(f"@{path}")


async def _never_called(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the request got past the key guard")


def _status(app: ApiKeyMiddleware, headers: list[tuple[bytes, bytes]]) -> int:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/v1/models", "method": "GET", "headers": headers}
    asyncio.run(app(scope, receive, send))
    return int(sent[0]["status"])


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
