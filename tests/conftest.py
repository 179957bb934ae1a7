"""The tiers, applied by where a test lives (docs/testing.md#tiers).

- `unit`: no engine process, no browser, no peer server; the fake engine, real HTTP on
  loopback, a Redis of the test process's own, and the deployment tools. `make unit`.
- `integration`: real gateways on the real engine, peer servers (vLLM's, llama.cpp's, the
  fault upstream), a real browser. `make test` runs both tiers.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
INTEGRATION = ("integration", "browser")
"""The folders of tests/ whose tests are in the integration tier; every other is unit."""


def tier(path: Path) -> str:
    folder = path.relative_to(TESTS).parts[0]
    return "integration" if folder in INTEGRATION else "unit"


HEAVY = "heavy"
HEAVY_MODULES = frozenset(
    {
        # Two engines at once (pairs of gateways), or three tensor-parallel workers.
        "integration/test_embeddings.py",
        "integration/test_engine_admission.py",
        "integration/test_lifecycle.py",
        "integration/test_vllm_parity.py",
        "integration/test_parallel_engine.py",
        "integration/test_redis_resilience.py",
        "integration/test_workers.py",
        # An engine beside another large process: Prometheus and a second gateway, vLLM's own
        # server, Chromium.
        "integration/test_monitoring.py",
        "integration/test_upstream_vllm.py",
        # vLLM's own server beside the gateway, both on the reasoning variant of the model.
        "integration/reasoning/test_parity.py",
        "integration/reasoning/test_agents.py",
        # vLLM's own server beside the gateway, both on the vision model.
        "integration/vision/test_parity.py",
        "browser/test_cors.py",
        "browser/test_playground.py",
        # One engine, in this lane to even the two out: on 2026-12-06 the other ran 23.2
        # minutes and this one 18.0; this module took 1.8.
        "integration/test_slow_clients.py",
    }
)
"""The integration tier runs in two lanes side by side (scripts/test_tiers.py): these modules,
which hold the most memory at once (and one more, for balance), in one; every other (the tests
on the session's shared gateway last) in the other. Each run prints each lane's most expensive
modules, to keep the lanes about as long as each other."""


def uses_shared_gateway(item: pytest.Item) -> bool:
    """Whether the test runs on the session's one default gateway (`gateway`, `base_url` and
    the clients over it, in tests/integration/conftest.py)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in ("gateway", "base_url"):
        definitions = info.name2fixturedefs.get(name)
        # The last definition is the one the test gets; modules override `gateway` with
        # gateways of their own, module-scoped.
        if definitions and definitions[-1].scope == "session":
            return True
    return False


UNIT_TIMEOUT = 300
"""pytest's timeout for a unit test (the integration tier's is pyproject.toml's, above the
gateway helper's start limit): a unit test starts no engine, and one that hangs should not
cost the run more than this."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(item.path)
        item.add_marker(tier(path))
        if tier(path) == "unit" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT))
        if path.relative_to(TESTS).as_posix() in HEAVY_MODULES:
            item.add_marker(HEAVY)
    # The tests on the shared gateway last: it starts when the first of them runs and lives
    # to the end of the session, so the gateways of the other modules never run beside it.
    items.sort(key=uses_shared_gateway)


MODULES_SHOWN = 12
_module_seconds: Counter[str] = Counter()
"""Each module's time in this run: its tests' setup, call and teardown, with the module's and
session's fixtures counted where they start and stop."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _module_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The most expensive modules of the run, so that a growing suite shows where it grows
    (docs/testing.md#tiers)."""
    if not _module_seconds:
        return
    terminalreporter.section("the most expensive modules")
    for module, seconds in _module_seconds.most_common(MODULES_SHOWN):
        terminalreporter.write_line(f"{seconds / 60:5.1f} min  {module}")


GUARDED = ("SLUICEGATE_", "HF_", "TRANSFORMERS_", "OTEL_", "PROMETHEUS_")
"""The variables a test may not leave changed: what the gateway and the libraries it hands
them to read (its settings, the hub's, OpenTelemetry's, the metrics' folder). Libraries write
variables of their own, which are not a test's doing: on import (OpenCV prepends to
LD_LIBRARY_PATH, vLLM sets TORCHINDUCTOR_COMPILE_THREADS and others) and as they configure
(vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD)."""


@pytest.fixture(autouse=True)
def _environment_left_as_found() -> Iterator[None]:
    """No test leaves a `GUARDED` variable changed for the tests after it: the change is put
    back and the test fails, naming the variables (not their values). Set variables with
    `monkeypatch.setenv`, which undoes them before this looks (this fixture is set up first,
    so torn down last)."""
    before = {name: value for name, value in os.environ.items() if name.startswith(GUARDED)}
    yield
    names = before.keys() | {name for name in os.environ if name.startswith(GUARDED)}
    changed = sorted(name for name in names if before.get(name) != os.environ.get(name))
    if not changed:
        return
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    pytest.fail(f"the test left the environment changed: {', '.join(changed)}", pytrace=False)
