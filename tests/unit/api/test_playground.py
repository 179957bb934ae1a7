"""The playground page: served from the package, without a key, only where enabled."""

from __future__ import annotations

from fastapi.testclient import TestClient

from sluicegate.settings import Settings
from tests.support.fakes import fake_app

IDS = ("prompt", "send", "stop", "output", "ttft", "cache", "error")


def test_the_page_and_its_files_are_served_without_a_key() -> None:
    with TestClient(fake_app(api_keys="sk-play", playground=True)) as client:
        page = client.get("/playground/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for element in IDS:
            assert f'id="{element}"' in page.text
        for asset in ("app.js", "sse.js", "style.css"):
            assert client.get(f"/playground/{asset}").status_code == 200
        # The API still asks for the key.
        assert client.get("/v1/models").status_code == 401


def test_the_page_loads_nothing_from_another_site() -> None:
    with TestClient(fake_app(playground=True)) as client:
        for asset in ("", "app.js", "sse.js", "style.css"):
            text = client.get(f"/playground/{asset}").text
            assert "http://" not in text and "https://" not in text


def test_without_the_playground_its_path_is_a_404() -> None:
    with TestClient(fake_app(playground=False)) as client:
        assert client.get("/playground/").status_code == 404


def test_the_playground_is_on_by_default_only_on_loopback() -> None:
    def enabled(host: str) -> bool:
        return Settings(host=host, _env_file=None).playground_enabled  # type: ignore[call-arg]

    assert enabled("127.0.0.1") and enabled("::1") and enabled("localhost")
    assert not enabled("0.0.0.0") and not enabled("10.1.2.3")
