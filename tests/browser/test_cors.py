"""A page on another origin calls the gateway from a real Chromium, through CORS."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import KEY, Origins
from tests.support.gateway import MODEL_NAME, GatewayProcess


def run_page(driver: webdriver.Chrome, origin: str, gateway: GatewayProcess) -> dict[str, Any]:
    query = urlencode({"gateway": gateway.url, "key": KEY, "model": MODEL_NAME})
    driver.get(f"{origin}/cross_origin.html?{query}")
    WebDriverWait(driver, 120).until(lambda d: d.find_element(By.ID, "result").text)
    return dict(json.loads(driver.find_element(By.ID, "result").text))


def test_an_allowed_origin_streams_and_reads_headers_and_errors(
    driver: webdriver.Chrome, origins: Origins, browser_gateway: GatewayProcess
) -> None:
    result = run_page(driver, origins.allowed, browser_gateway)
    stream = result["stream"]
    assert stream["status"] == 200 and stream["done"]
    assert stream["events"] >= 3 and stream["text"]
    assert stream["requestId"]  # exposed, so the script can read it
    assert result["wrongKey"]["status"] == 401
    assert "API key" in result["wrongKey"]["message"]


def test_an_origin_not_allowed_is_blocked_by_the_browser(
    driver: webdriver.Chrome, origins: Origins, browser_gateway: GatewayProcess
) -> None:
    result = run_page(driver, origins.blocked, browser_gateway)
    assert result["blocked"] is True
    assert result["error"].startswith("TypeError")  # fetch() fails: CORS withheld the answer
