"""`SLUICEGATE_REDIS_URL` forms the cache accepts: TLS (`rediss://`), a Unix socket
(`unix://`), an ACL user with a password; and a wrong password failing open. Against a real
redis-server started here with TLS, a socket, and the default user disabled."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread
from tests.support.gateway import free_port

USER, PASSWORD = "gateway", "s3cret-pw"


@dataclass
class SecureRedis:
    folder: Path
    tls_port: int

    @property
    def socket(self) -> Path:
        return self.folder / "redis.sock"

    @property
    def ca(self) -> Path:
        return self.folder / "cert.pem"


@pytest.fixture(scope="module")
def secure_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRedis]:
    folder = tmp_path_factory.mktemp("secure-redis")
    server = SecureRedis(folder, free_port())
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(folder / "key.pem"), "-out", str(server.ca),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    binary = shutil.which("redis-server")
    assert binary, "redis-server is installed by `make test` (scripts/ensure-redis.sh)"
    for _ in range(3):
        process = _started(binary, server)
        if process is not None:
            break
        server.tls_port = free_port()  # taken after free_port chose it: another
    else:
        raise AssertionError("redis did not start: three TLS ports taken in turn")
    yield server
    process.kill()
    process.wait(10)


def _started(binary: str, server: SecureRedis) -> subprocess.Popen[bytes] | None:
    """Redis on `server`'s TLS port and socket, answering; None if it exited (its port taken)."""
    folder = server.folder
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(server.tls_port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(folder / "key.pem").replace("key", "cert"),
         "--tls-key-file", str(folder / "key.pem"), "--tls-ca-cert-file", str(server.ca),
         "--tls-auth-clients", "no", "--unixsocket", str(server.socket), "--save", "",
         "--appendonly", "no", "--dir", str(folder),
         "--user", "default", "off",
         "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(unix_socket_path=str(server.socket), username=USER, password=PASSWORD)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return process
            except (redis.ConnectionError, FileNotFoundError):
                if process.poll() is not None:
                    return None
                assert time.monotonic() < deadline, "redis did not start"
                time.sleep(0.05)
    finally:
        client.close()


def urls(server: SecureRedis) -> dict[str, str]:
    auth = f"{USER}:{PASSWORD}"
    return {
        "tls": f"rediss://{auth}@127.0.0.1:{server.tls_port}/0?ssl_ca_certs={server.ca}",
        "unix": f"unix://{auth}@{server.socket}?db=1",
    }


def body(max_tokens: int = 16) -> dict[str, object]:
    return {
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


@pytest.mark.parametrize("form", ["tls", "unix"])
async def test_cache_works_over_each_url_form(secure_redis: SecureRedis, form: str) -> None:
    url = urls(secure_redis)[form]
    engine = FakeEngine()
    with serve_in_thread(
        fake_app(engine, redis_url=url, redis_key_prefix=f"urls-{form}", cache_redis_timeout=1.0)
    ) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            outcomes = [
                (await client.post("/v1/chat/completions", json=body())).headers["x-cache"]
                for _ in range(2)
            ]
    assert outcomes == ["MISS", "HIT"]
    assert len(engine.requests) == 1
    reader = redis.Redis(
        unix_socket_path=str(secure_redis.socket),
        username=USER,
        password=PASSWORD,
        db=0 if form == "tls" else 1,
    )
    assert len(list(reader.scan_iter(match=f"urls-{form}:cache:v1:*"))) == 1
    reader.close()


async def test_a_wrong_password_fails_open(secure_redis: SecureRedis) -> None:
    url = f"unix://{USER}:wrong@{secure_redis.socket}?db=0"
    engine = FakeEngine()
    with serve_in_thread(fake_app(engine, redis_url=url, cache_retry_interval=0)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            # Three different requests: an entry this process is still writing (to a Redis
            # that refuses it) would answer a repeat of its own request.
            responses = [
                await client.post("/v1/chat/completions", json=body(8 + i)) for i in range(3)
            ]
    assert [r.status_code for r in responses] == [200] * 3
    assert [r.headers["x-cache"] for r in responses] == ["MISS"] * 3
    assert len(engine.requests) == 3
