"""The playground in a real Chromium: it streams, shows a cache hit, and Stop aborts."""

from __future__ import annotations

import json
import re
import time

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser.conftest import ARTIFACTS, KEY
from tests.support.gateway import MODEL_NAME, GatewayProcess
from tests.support.metrics import metric_value

STORY = "Write a short story about a lighthouse keeper."
COUNTING = "Count from 1 to 400, one number per line."
ENDLESS = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
"""A JSON schema whose answers are longer than any max_tokens these tests send."""


RECORD_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
"""
"""Run before the page's own scripts (through DevTools, which the policy does not bind)."""


@pytest.fixture(scope="module")
def page(driver: webdriver.Chrome, browser_gateway: GatewayProcess) -> webdriver.Chrome:
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    driver.get(f"{browser_gateway.url}/playground/")
    key = driver.find_element(By.ID, "api-key")
    key.send_keys(KEY, Keys.TAB)  # the change event stores the key and loads the models
    WebDriverWait(driver, 10).until(
        lambda d: [o.text for o in Select(d.find_element(By.ID, "model")).options] == [MODEL_NAME]
    )
    set_field(driver, "temperature", "0")
    return driver


def set_field(driver: webdriver.Chrome, element: str, value: str) -> None:
    field = driver.find_element(By.ID, element)
    field.clear()
    field.send_keys(value)


def text(driver: webdriver.Chrome, element: str) -> str:
    return str(driver.find_element(By.ID, element).text)


def send(driver: webdriver.Chrome, prompt: str, max_tokens: int) -> None:
    set_field(driver, "prompt", prompt)
    set_field(driver, "max-tokens", str(max_tokens))
    driver.find_element(By.ID, "send").click()


def finished(driver: webdriver.Chrome, timeout: float = 120) -> None:
    WebDriverWait(driver, timeout).until(
        expected_conditions.element_to_be_clickable((By.ID, "send"))
    )


def test_the_answer_streams_into_the_page_with_its_numbers(page: webdriver.Chrome) -> None:
    send(page, STORY, 48)
    lengths: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lengths.append(len(text(page, "output")))
        if page.find_element(By.ID, "send").is_enabled():
            break
        time.sleep(0.05)
    grown = sorted({n for n in lengths if n > 0})
    # Sampled while it streamed: the text was seen at several lengths before the end.
    assert len(grown) >= 4, lengths
    assert lengths == sorted(lengths)
    assert re.fullmatch(r"\d+ ms", text(page, "ttft"))
    assert re.fullmatch(r"\d+ in, \d+ out", text(page, "usage"))
    assert text(page, "cache") == "MISS"
    assert text(page, "request-id") not in ("", "–")
    assert "max-tokens: 48" in text(page, "budget")
    assert text(page, "error") == ""
    ARTIFACTS.mkdir(exist_ok=True)
    page.save_screenshot(str(ARTIFACTS / "playground.png"))


def test_the_same_prompt_again_is_a_cache_hit(page: webdriver.Chrome) -> None:
    first = text(page, "output")
    send(page, STORY, 48)
    finished(page)
    assert text(page, "cache") == "HIT"
    assert text(page, "output") == first


def test_stop_aborts_the_engine_request(
    page: webdriver.Chrome, browser_gateway: GatewayProcess
) -> None:
    # Left to itself the model stops counting after about 120 tokens (a few seconds), so a
    # slow machine could see the answer end before Stop is clicked. An array of at least
    # 1,000 numbers cannot end before max_tokens: the stream is still running at the click.
    set_field(page, "schema", json.dumps(ENDLESS))
    try:
        send(page, COUNTING, 1500)
        WebDriverWait(page, 60).until(lambda d: len(text(d, "output")) > 10)
    finally:
        set_field(page, "schema", "")
    assert not page.find_element(By.ID, "send").is_enabled(), "the answer ended before Stop"
    assert metric_value(browser_gateway.url, "vllm:num_requests_running") >= 1
    page.find_element(By.ID, "stop").click()
    # The abort reaches the engine (a fraction of a second; the answer would run on for
    # many seconds): 5 s leaves room for a loaded two-core machine.
    stopped = time.monotonic()
    while (running := metric_value(browser_gateway.url, "vllm:num_requests_running")) > 0:
        assert time.monotonic() - stopped < 5, (
            f"the engine still runs {running:g} requests (vllm:num_requests_running) "
            f"{time.monotonic() - stopped:.1f} s after Stop"
        )
        time.sleep(0.05)
    finished(page, 5)
    assert text(page, "error") == "Stopped."


def test_an_error_is_shown_as_its_openai_message(page: webdriver.Chrome) -> None:
    set_field(page, "temperature", "7")  # above 2: a 400
    send(page, STORY, 8)
    finished(page)
    set_field(page, "temperature", "0")
    assert "temperature" in text(page, "error")
    assert text(page, "output") == ""


PARSE_CHUNKS = """
const [chunks, done] = arguments;
const body = new ReadableStream({
  start(controller) {
    for (const chunk of chunks) controller.enqueue(Uint8Array.from(chunk));
    controller.close();
  },
});
const seen = [];
readEvents(body, (data) => { seen.push(data); return data === "[DONE]"; })
  .then(() => done(seen), (err) => done([`failed: ${err}`]));
"""


def test_the_page_parses_events_split_anywhere(page: webdriver.Chrome) -> None:
    stream = (
        'data: {"a":"caf\u00e9"}\r\n\r\n'
        ": a comment\n"
        'data: {"b":\ndata: 2}\n\n'
        'data: {"error":{"message":"late"}}\r\r'
        "data: [DONE]\n\n"
        "data: after the end\n\n"
    )
    # Cut the UTF-8 bytes everywhere, a multi-byte character and CRLFs included: the parser
    # sees the same events whatever the network's chunks were.
    raw = stream.encode()
    for size in (1, 2, 3, 7):
        chunks = [list(raw[i : i + size]) for i in range(0, len(raw), size)]
        seen = page.execute_async_script(PARSE_CHUNKS, chunks)
        assert seen == [
            '{"a":"café"}',
            '{"b":\n2}',
            '{"error":{"message":"late"}}',
            "[DONE]",
        ], size


def test_a_json_schema_constrains_the_answer(page: webdriver.Chrome) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    }
    set_field(page, "schema", json.dumps(schema))
    send(page, "Which city is the capital of France?", 40)
    finished(page)
    set_field(page, "schema", "")
    assert text(page, "error") == ""
    answer = json.loads(text(page, "output"))
    assert isinstance(answer, dict) and isinstance(answer["city"], str)


def test_the_page_works_within_its_content_security_policy(page: webdriver.Chrome) -> None:
    # Last in this file: every test before used the page under the policy.
    assert page.execute_script("return window.cspViolations") == []
    ran = page.execute_script(
        "const s = document.createElement('script');"
        "s.textContent = 'window.inlineRan = true';"
        "document.body.append(s);"
        "return window.inlineRan === true;"
    )
    # An inline script, as an injection would add, is refused and reported.
    assert ran is False
    WebDriverWait(page, 5).until(lambda d: d.execute_script("return window.cspViolations"))
    assert page.execute_script("return window.cspViolations") == ["script-src-elem inline"]
