"""The upstream overhead benchmark (bench/upstream_overhead.py): its turn order, its reading of
streams and its table, checked against the fault upstream as a real server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from tests.support.fault_upstream import FaultUpstreamProcess, start
from upstream_overhead import TARGETS, litellm_config, load, report, schedule


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstreamProcess]:
    process = start(0, "--chunks", "8")
    yield process
    process.stop()


def test_each_target_takes_each_place_once_every_four_rounds_at_each_level() -> None:
    assert len(TARGETS) == 4
    turns = schedule(8, [1, 100])
    assert [(r, level) for r, level, _ in turns[:4]] == [(0, 1), (0, 100), (1, 1), (1, 100)]
    for level in (1, 100):
        orders = [order for _, lvl, order in turns if lvl == level]
        assert all(sorted(order) == sorted(TARGETS) for order in orders)
        for place in range(4):
            assert sorted(o[place] for o in orders[:4]) == sorted(TARGETS)
        assert orders[:4] == orders[4:]


def test_a_turn_reads_every_stream_to_its_end(upstream: FaultUpstreamProcess) -> None:
    before = upstream.stats()["completed"]
    result = uvloop.run(load(f"{upstream.url}/chat/completions", 30, 10, 8))
    assert len(result["latency"]) == len(result["ttfb"]) == 30
    assert all(0 < t <= total for t, total in zip(result["ttfb"], result["latency"], strict=True))
    assert upstream.stats()["completed"] == before + 30


def test_a_stream_cut_short_fails_the_turn(upstream: FaultUpstreamProcess) -> None:
    upstream.control(status=503, times=1)
    try:
        with pytest.raises(RuntimeError, match="503"):
            uvloop.run(load(f"{upstream.url}/chat/completions", 5, 1, 8))
        # 50 tokens asked for, 8 come (the upstream's whole answer): the stream is short.
        with pytest.raises(SystemExit, match="short"):
            uvloop.run(load(f"{upstream.url}/chat/completions", 2, 1, 50))
    finally:
        upstream.control(reset_all=True)


def test_the_table_subtracts_the_direct_figures_and_divides_the_overheads() -> None:
    def rounds(latency_ms: float, ttfb_ms: float) -> list[dict[str, object]]:
        one = {"req_per_s": 100.0, "cpu_ms_per_request": 1.0,
               "latency": [latency_ms / 1000] * 10, "ttfb": [ttfb_ms / 1000] * 10}  # fmt: skip
        return [one, one]

    level = {
        "direct": rounds(10, 2),
        "sluicegate": rounds(11, 2.5),
        "sluicegate-b": rounds(12, 3),
        "litellm": rounds(20, 7),
    }
    lines = report({100: level}, stand_in=False).splitlines()
    assert "| 100 | sluicegate (aiohttp) | 1.00 | 1.00 | 0.50 | 0.50 |" in lines
    assert "| 100 | sluicegate (httpcore) | 2.00 | 2.00 | 1.00 | 1.00 |" in lines
    assert "| 100 | LiteLLM proxy | 10.00 | 10.00 | 5.00 | 5.00 |" in lines
    ratio = "**0.100x** | **0.100x** | **0.100x** | **0.100x** |"
    assert f"| 100 | **sluicegate (aiohttp) / LiteLLM** | {ratio}" in lines
    ratio = "**0.200x** | **0.200x** | **0.200x** | **0.200x** |"
    assert f"| 100 | **sluicegate (httpcore) / LiteLLM** | {ratio}" in lines
    assert "- concurrency 100, sluicegate (aiohttp): 1.00, 1.00" in lines


def test_litellm_sends_every_model_to_the_upstream() -> None:
    config = litellm_config("http://127.0.0.1:9/v1")
    bases = {m["litellm_params"]["api_base"] for m in config["model_list"]}
    assert bases == {"http://127.0.0.1:9/v1"}
    assert {m["model_name"] for m in config["model_list"]} == {"fault-model", "*"}


def test_the_rendered_variant_names_both_sluicegates_by_their_path() -> None:
    one = [{"req_per_s": 1.0, "cpu_ms_per_request": 1.0, "latency": [0.01], "ttfb": [0.001]}]
    level = {name: one for name in ("direct", "sluicegate", "sluicegate-b", "litellm")}
    text = report({1: level}, stand_in=False, variant="rendered")
    assert "| 1 | sluicegate (pass-through) |" in text
    assert "| 1 | **sluicegate (rendered) / LiteLLM** |" in text
