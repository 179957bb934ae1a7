"""Who may read what names keys and models on the probe paths: with managed keys, `/metrics`
(per-key series) is for admin and scraper keys (`METRICS_API_KEYS`), and `/ready` names the
models to them alone; `/metrics/engine` and `/ready`'s status stay open. Over the real app (a
fake engine) served on loopback HTTP, with a real Redis for the managed keys."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.fakes import FAKE_MODEL, fake_app, serve_in_thread
from tests.support.replicas import ADMIN, auth, chat, create_key, replica

SCRAPER = "sk-scraper-0123456789"
USER = "sk-user-0123456789"


@pytest.fixture
def url(prefix: str) -> Iterator[str]:
    with serve_in_thread(replica(prefix, metrics_api_keys=SCRAPER)) as base:
        yield base


def test_with_managed_keys_the_metrics_are_for_admin_and_scraper_keys(url: str) -> None:
    tenant = create_key(url)["key"]
    assert chat(url, tenant).status_code == 200  # a per-key series to hide
    assert httpx.get(f"{url}/metrics").status_code == 401
    refused = httpx.get(f"{url}/metrics", headers=auth(tenant))
    assert refused.status_code == 403, refused.text
    assert "SLUICEGATE_METRICS_API_KEYS" in refused.json()["error"]["message"]
    for key in (ADMIN, SCRAPER):
        scrape = httpx.get(f"{url}/metrics", headers=auth(key))
        assert scrape.status_code == 200
        assert "sluicegate_key_requests_total{" in scrape.text
    # The engine's scheduling state, for routers: open, and it names no key.
    engine = httpx.get(f"{url}/metrics/engine")
    assert engine.status_code == 200 and "key-" not in engine.text


def test_a_scrapers_key_opens_nothing_but_the_probe_paths(url: str) -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/admin/keys"), ("GET", "/v1/me/usage")]:
        answer = httpx.request(method, f"{url}{path}", headers=auth(SCRAPER))
        assert answer.status_code == 401, (path, answer.text)
    assert chat(url, SCRAPER).status_code == 401


def test_with_managed_keys_ready_names_the_models_to_admin_and_scraper_keys_only(
    url: str,
) -> None:
    tenant = create_key(url)["key"]
    for headers in ({}, auth(tenant), auth("sk-wrong")):
        answer = httpx.get(f"{url}/ready", headers=headers)
        assert answer.status_code == 200
        assert answer.json() == {"status": "ready"}
    for key in (ADMIN, SCRAPER):
        detail = httpx.get(f"{url}/ready", headers=auth(key)).json()
        assert detail == {"status": "ready", "models": {FAKE_MODEL: "ready"}}


def test_without_managed_keys_the_probes_are_as_they_were() -> None:
    app = fake_app(api_keys=USER, metrics_api_keys=SCRAPER)
    with serve_in_thread(app) as url:
        assert httpx.get(f"{url}/metrics").status_code == 200
        ready = httpx.get(f"{url}/ready").json()
        assert ready == {"status": "ready", "models": {FAKE_MODEL: "ready"}}


def test_a_scrapers_key_reads_metrics_that_require_a_key() -> None:
    app = fake_app(api_keys=USER, metrics_require_auth=True, metrics_api_keys=SCRAPER)
    with serve_in_thread(app) as url:
        for path in ("/metrics", "/metrics/engine"):
            assert httpx.get(f"{url}{path}").status_code == 401
            assert httpx.get(f"{url}{path}", headers=auth(SCRAPER)).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers=auth(SCRAPER)).status_code == 401
