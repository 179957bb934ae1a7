"""The `openai` JS SDK (tests/js/client.mjs, run with node) against the session gateway.

`make test` installs the SDK with `npm ci --prefix tests/js` (the version pinned in
tests/js/package-lock.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

JS_DIR = Path(__file__).resolve().parents[1] / "js"


@pytest.fixture(scope="module")
def js_results(base_url: str, model: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "node is not installed: the JS client tests need Node.js 20+ and npm"
    assert (JS_DIR / "node_modules" / "openai").is_dir(), (
        "the JS SDK is not installed: run `make test`, or `npm ci --prefix tests/js`"
    )
    done = subprocess.run(
        [node, "client.mjs"],
        cwd=JS_DIR,
        env={**os.environ, "GATEWAY_BASE_URL": base_url, "GATEWAY_MODEL": model},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results: dict[str, Any] = json.loads(done.stdout)
    return results


def result(js_results: dict[str, Any], call: str) -> dict[str, Any]:
    outcome: dict[str, Any] = js_results[call]
    assert "error" not in outcome, outcome["error"]
    return outcome


def test_js_stream_chat_completion(js_results: dict[str, Any]) -> None:
    stream = result(js_results, "stream")
    whole = result(js_results, "whole")
    assert stream["content_chunks"] > 1, "the content arrives in several chunks"
    assert stream["chunks"] > stream["content_chunks"], "a last chunk carries finish_reason"
    assert stream["objects"] == ["chat.completion.chunk"]
    assert len(stream["ids"]) == 1 and stream["ids"][0].startswith("chatcmpl-")
    assert stream["first_role"] == "assistant"
    assert stream["finish_reason"] in ("length", "stop")
    assert stream["text"].strip()
    # Greedy: the stream says what the same request answers whole.
    assert stream["text"] == whole["text"]
    assert stream["finish_reason"] == whole["finish_reason"]


def test_js_json_object(js_results: dict[str, Any]) -> None:
    reply = result(js_results, "json_object")
    assert reply["finish_reason"] == "stop"
    assert isinstance(json.loads(reply["content"]), dict)
