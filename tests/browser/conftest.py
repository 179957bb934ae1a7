"""A real headless Chromium (Debian's, through chromedriver) against a real gateway.

The gateway runs with an API key and one allowed CORS origin: the port of a page server
started here. A second page server on another port is an origin the gateway does not allow.
All of it lives for this package's tests only, so its engine's memory is free for the rest.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.gateway import GatewayProcess, running_gateway

KEY = "sk-browser-5e1d"
PAGES = Path(__file__).parent / "pages"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
"""Screenshots the browser tests save (git ignores the folder)."""


@dataclass(frozen=True)
class Origins:
    allowed: str
    blocked: str


@contextlib.contextmanager
def page_server() -> Iterator[str]:
    """The test pages, served from this process on a loopback port it binds itself."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(PAGES))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="package")
def origins() -> Iterator[Origins]:
    with page_server() as allowed, page_server() as blocked:
        yield Origins(allowed, blocked)


@pytest.fixture(scope="package")
def browser_gateway(
    tmp_path_factory: pytest.TempPathFactory, origins: Origins
) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path_factory.mktemp("browser"),
        env={"SLUICEGATE_API_KEYS": KEY, "SLUICEGATE_CORS_ALLOW_ORIGINS": origins.allowed},
    ) as gateway:
        yield gateway


@pytest.fixture(scope="package")
def driver() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    chrome = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    chrome.set_script_timeout(30)
    yield chrome
    chrome.quit()
