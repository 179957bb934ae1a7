"""tests/conftest.py's own checks: a test that leaves the environment changed fails, and each
run names its most expensive modules."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A suite of its own, under a copy of tests/conftest.py."""
    pytester.makeconftest(CONFTEST.read_text())
    return pytester


def test_a_test_that_leaves_a_variable_set_fails_and_the_next_does_not_see_it(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        test_leaks="""
import os

def test_leaks():
    os.environ["HF_LEAKED_BY_A_TEST"] = "secret-value"

def test_after():
    assert "HF_LEAKED_BY_A_TEST" not in os.environ
"""
    )
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*the test left the environment changed: HF_LEAKED_BY_A_TEST*"])
    assert "secret-value" not in result.stdout.str()


def test_a_removed_variable_fails_too_and_is_put_back(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_SET_BEFORE_THE_SUITE", "1")
    suite.makepyfile(
        test_removes="""
import os

def test_removes():
    del os.environ["HF_SET_BEFORE_THE_SUITE"]

def test_after():
    assert os.environ["HF_SET_BEFORE_THE_SUITE"] == "1"
"""
    )
    result = suite.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*environment changed: HF_SET_BEFORE_THE_SUITE*"])


def test_monkeypatched_variables_are_undone_before_the_check(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_patches="""
def test_patches(monkeypatch):
    monkeypatch.setenv("OTEL_PATCHED_BY_A_TEST", "1")
"""
    )
    suite.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_variables_libraries_set_for_themselves_are_not_a_tests_doing(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        test_library="""
import os

def test_imports_a_library():
    os.environ["LD_LIBRARY_PATH"] = "/opt/some-library"  # as OpenCV does on import
"""
    )
    suite.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_run_names_its_most_expensive_modules(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_slow="import time\n\ndef test_slow():\n    time.sleep(0.2)\n")
    result = suite.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*the most expensive modules*", "*min  test_slow.py"])
