"""The admin endpoints' guard (`http.admin_guard`), over the app with the fake engine served
on loopback HTTP: a feature that is off, a caller who is not an admin, an admin over the admin
limit and an admin body over its cap are all answered before the body is read.

"Before the body is read" is shown by sending a request's head and a first kilobyte of a body
said to be 8 MB long, and nothing more: the answer comes although the rest never does. A
gateway that read the body first would wait for it (`REQUEST_BODY_TIMEOUT`, two minutes here)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError

from sluicegate.settings import Settings
from sluicegate.wire.admin_keys import MAX_AMOUNT, MAX_COST, KeyCreate
from tests.support.fakes import chat_body, fake_app, serve_in_thread
from tests.support.loop_probe import PROBE

ADMIN = "sk-admin-0123456789"
USER = "sk-user-0123456789"
LOAD = "/v1/load_lora_adapter"
BODY_WAIT_S = 120.0
"""The gateway's `REQUEST_BODY_TIMEOUT` in these tests: how long it would wait for a body."""
ANSWER_WITHIN_S = 20.0
"""How long a refusal may take to come back (it takes milliseconds): far less than
`BODY_WAIT_S`, so a refusal that waited for the body cannot pass."""
DECLARED = 8 * 1024 * 1024


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def url() -> Iterator[str]:
    app = fake_app(
        api_keys=USER,
        admin_api_keys=ADMIN,
        allow_runtime_lora=True,
        lora_roots="/adapters",
        request_body_timeout=BODY_WAIT_S,
        admin_requests_per_minute=1000,
    )
    with serve_in_thread(app) as base:
        yield base


def answer_without_the_body(
    url: str, method: str, path: str, headers: dict[str, str], declared: int = DECLARED
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the answer to a request whose body is said to be `declared`
    bytes long, of which only the first kilobyte is ever sent."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}"]
    head += ["content-type: application/json", f"content-length: {declared}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((host, port), timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"a": "' + b"x" * 1017)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed without an answer: {received!r}"
            received += chunk
        top, _, body = received.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(fields["content-length"]):
            chunk = sock.recv(65536)
            assert chunk, "the connection closed in the middle of the answer"
            body += chunk
    return int(lines[0].split()[1]), json.loads(body)


@pytest.mark.parametrize(
    ("headers", "status"), [({}, 401), (bearer("sk-wrong"), 401), (bearer(USER), 403)]
)
@pytest.mark.parametrize(
    "path",
    [
        LOAD,
        "/v1/unload_lora_adapter",
        # Routed there through a redirect, once the body is read: the same paths.
        f"{LOAD}/",
        f"{LOAD}%2F",
        "/v1/unload_lora_adapter/",
        "/v1/unload_lora_adapter%2F",
    ],
)
def test_a_caller_without_an_admin_key_is_refused_before_its_body_is_read(
    url: str, path: str, headers: dict[str, str], status: int
) -> None:
    got, body = answer_without_the_body(url, "POST", path, headers)
    assert got == status, body
    assert body["error"]["code"] == ("permission_denied" if status == 403 else "invalid_api_key")


def test_admin_keys_alone_refuse_anonymous_admin_calls_before_the_body() -> None:
    app = fake_app(
        admin_api_keys=ADMIN,
        allow_runtime_lora=True,
        lora_roots="/adapters",
        request_body_timeout=BODY_WAIT_S,
    )
    with serve_in_thread(app) as url:
        status, body = answer_without_the_body(url, "POST", LOAD, {})
        assert status == 401, body
        # The other routes need no key with admin keys alone.
        assert httpx.post(f"{url}/v1/chat/completions", json=chat_body()).status_code == 200


def test_an_admin_body_over_the_admin_cap_is_a_413_before_it_is_read(url: str) -> None:
    status, body = answer_without_the_body(url, "POST", LOAD, bearer(ADMIN))
    assert status == 413, body
    cap = Settings.model_fields["admin_max_request_bytes"].default
    assert body["error"]["code"] == "request_too_large" and str(cap) in body["error"]["message"]
    # Only the admin endpoints have the small cap: a chat body of the same size is read.
    chat = chat_body("x" * (cap + 1024))
    answer = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=bearer(USER))
    assert answer.status_code == 200, answer.text


def test_the_admin_cap_takes_the_largest_key_settings_an_admin_may_send() -> None:
    """Every field at its largest, its text in characters of four bytes (256 model names of
    256 bytes, a name of 256 characters, 4 KiB of metadata), sent as raw UTF-8: taken, and
    within the default cap with room to spare. A model name of more bytes is refused."""
    wide = "\U0001f600"  # four bytes in UTF-8
    largest = {
        "name": wide * 256,
        "models": [wide * 64] * 256,
        "rpm": MAX_AMOUNT,
        "tpm": MAX_AMOUNT,
        "priority": -1000,
        "budget": {"cost": float(MAX_COST), "period": "month"},
        "expires_at": "9999-12-31T23:59:59+00:00",
        "metadata": {"k": "v" * 4080},
    }
    body = json.dumps(largest, indent=2, ensure_ascii=False).encode()
    assert KeyCreate.model_validate_json(body).models == largest["models"]
    assert len(body) * 1.25 < Settings.model_fields["admin_max_request_bytes"].default, len(body)
    with pytest.raises(ValidationError, match="at most 256 bytes in UTF-8") as caught:
        KeyCreate.model_validate_json(json.dumps({"models": [wide * 65]}, ensure_ascii=False))
    assert caught.value.errors()[0]["loc"][0] == "models"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/admin/keys", "SLUICEGATE_MANAGED_KEYS"),
        ("/admin/keys/key-0123456789ab", "SLUICEGATE_MANAGED_KEYS"),
        (LOAD, "SLUICEGATE_ALLOW_RUNTIME_LORA"),
        (f"{LOAD}/", "SLUICEGATE_ALLOW_RUNTIME_LORA"),
        ("/admin/admission", "SLUICEGATE_ALLOW_RUNTIME_ADMISSION"),
    ],
)
def test_a_route_whose_feature_is_off_is_a_404_before_the_body_is_read(
    path: str, says: str
) -> None:
    app = fake_app(api_keys=USER, admin_api_keys=ADMIN, request_body_timeout=BODY_WAIT_S)
    with serve_in_thread(app) as url:
        for headers in (bearer(ADMIN), bearer(USER)):
            status, body = answer_without_the_body(url, "POST", path, headers)
            assert status == 404, body
            assert says in body["error"]["message"]
        usage = httpx.get(f"{url}/admin/usage", headers=bearer(ADMIN))
        assert usage.status_code == 404 and "REDIS_URL" in usage.json()["error"]["message"]


def test_admin_calls_are_counted_in_a_limit_of_their_own() -> None:
    app = fake_app(
        api_keys=USER,
        admin_api_keys=ADMIN,
        allow_runtime_lora=True,
        lora_roots="/adapters",
        admin_requests_per_minute=2,
        rate_limit_requests_per_minute=1000,
    )
    with serve_in_thread(app) as url:
        # No such admin endpoint: counted all the same, then not found.
        answers = [httpx.get(f"{url}/admin/nothing", headers=bearer(ADMIN)) for _ in range(3)]
        assert [a.status_code for a in answers] == [404, 404, 429]
        refused = answers[-1]
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "admin calls" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # Its own limit: the admin key's other requests, and other keys, are not held by it.
        chat = httpx.post(f"{url}/v1/chat/completions", json=chat_body(), headers=bearer(ADMIN))
        assert chat.status_code == 200
        status, _ = answer_without_the_body(url, "POST", LOAD, bearer(USER))
        assert status == 403


def test_the_default_admin_limit_is_at_least_a_call_a_second() -> None:
    assert Settings.model_fields["admin_requests_per_minute"].default >= 60


SEND = """
import sys, httpx
from concurrent.futures import ThreadPoolExecutor
url, path, key, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
body = b'{"lora_name": "a", "lora_path": "b", "x": [' + b'{"a":{}},' * 900_000 + b'{}]}'
def send(_):
    return httpx.post(url + path, content=body, timeout=300, headers={
        "authorization": "Bearer " + key, "content-type": "application/json"}).status_code
with ThreadPoolExecutor(count) as pool:
    print(sorted(set(pool.map(send, range(count)))))
"""
BODIES = 8
"""Hostile bodies sent at once, 8 MB each, of many small nested objects: each took the loop
for 0.3 to 1 s to parse before the 403, and all of them kept `/health` unanswered for 3 to
8 s; refused before they are read, about 0.1 s (the probe interval's worth)."""
STALL_BOUND_S = 2.0
"""The longest `/health` may go without an answer while the bodies are sent and answered (the
probe interval included): a stall a user would see, as in tests/integration/
test_loop_lag.py, with room for a loaded two-core machine."""


def test_health_keeps_answering_while_a_non_admin_sends_8_mb_bodies_to_an_admin_route(
    url: str, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    with subprocess.Popen(
        [sys.executable, "-c", PROBE, url, str(stop), "0.05"], stdout=subprocess.PIPE, text=True
    ) as prober:
        assert prober.stdout is not None
        assert prober.stdout.readline().strip() == "probing"
        began = time.monotonic()
        sender = subprocess.run(
            [sys.executable, "-c", SEND, url, LOAD, USER, str(BODIES)],
            capture_output=True,
            text=True,
        )
        ended = time.monotonic()
        stop.touch()
        probes = json.loads(prober.stdout.read())
    assert sender.stdout.strip() == "[403]", sender.stdout + sender.stderr
    answers = sorted(at + wait for at, wait, _ in probes if began < at + wait < ended)
    points = [began, *answers, ended]
    silence = max(b - a for a, b in itertools.pairwise(points))
    assert all(status == 200 for _, _, status in probes)
    assert silence <= STALL_BOUND_S, (
        f"/health went {silence * 1000:.0f} ms without an answer in {ended - began:.2f} s"
    )
