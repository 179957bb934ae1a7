"""The playground's files through real HTTP: served under a strict policy."""

from __future__ import annotations

import httpx
import pytest

from tests.support.gateway import GatewayProcess


@pytest.mark.parametrize("path", ["", "index.html", "app.js", "sse.js", "style.css"])
def test_each_playground_file_carries_the_security_headers(
    gateway: GatewayProcess, path: str
) -> None:
    response = httpx.get(f"{gateway.url}/playground/{path}", timeout=30)
    assert response.status_code == 200
    policy = {
        directive.split(" ", 1)[0]: directive.split(" ", 1)[1]
        for directive in response.headers["content-security-policy"].split("; ")
    }
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    for directive in ("script-src", "style-src", "connect-src"):
        assert policy[directive] == "'self'"  # no 'unsafe-inline', no other origin
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
