"""The tiers, applied by where a test lives (docs/testing.md#tiers).

- `unit`: no engine process, no browser, no peer server; the fake engine, real HTTP on
  loopback, a Redis of the test process's own, and the deployment tools. `make unit`.
- `integration`: real gateways on the real engine, peer servers (vLLM's, llama.cpp's, the
  fault upstream), a real browser. `make test` runs both tiers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
INTEGRATION = ("integration", "browser")
"""The folders of tests/ whose tests are in the integration tier; every other is unit."""


def tier(path: Path) -> str:
    folder = path.relative_to(TESTS).parts[0]
    return "integration" if folder in INTEGRATION else "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier(Path(item.path)))
