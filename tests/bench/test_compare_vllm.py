"""The core benchmark: waiting for servers, its schedule of turns, and its reading of how
requests' first tokens group into engine steps."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

# The benchmark imports its sibling modules as a script does (`bench/` first on the path),
# whether or not another test module put it there first.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench.compare_vllm import (
    first_token_groups,
    level_seed,
    round_ratios,
    splits,
    turns,
    wait_ready,
)


def level(first_tokens: list[float]) -> dict[str, list[float]]:
    # Start times are arbitrary: only start + TTFT (the first token's time) counts.
    starts = [10.0 + i for i in range(len(first_tokens))]
    return {
        "start_times": starts,
        "ttfts": [f - s for f, s in zip(first_tokens, starts, strict=True)],
    }


def test_first_tokens_close_together_count_as_one_step() -> None:
    # A wave of 4 whose first arrival was prefilled alone, then 3 together, then a wave again.
    firsts = [20.0, 20.41, 20.412, 20.415, 26.0, 26.003, 26.4, 26.401]
    assert first_token_groups(level(firsts)) == [1, 3, 2, 2]


def test_order_of_requests_does_not_matter() -> None:
    assert first_token_groups(level([30.0, 20.0, 20.001])) == [2, 1]


def test_the_split_table_has_a_row_per_level_above_1_and_server() -> None:
    wave = level([20.0, 20.5, 20.501])
    results = {"vllm": [{1: wave, 3: wave}], "sluicegate": [{1: wave, 3: wave}, {1: wave, 3: wave}]}
    rows = splits(results, [1, 3]).splitlines()[2:]
    assert rows == ["| 3 | vllm | 1+2 |", "| 3 | sluicegate | 1+2; 1+2 |"]


def test_each_round_pairs_the_servers_that_ran_in_it() -> None:
    def run(throughput: float, ttfts: list[float]) -> dict[int, dict[str, object]]:
        return {1: {"output_throughput": throughput, "ttfts": ttfts}}

    results = {
        "vllm": [run(20.0, [0.5, 0.6, 0.7]), run(10.0, [1.0, 2.0])],
        "sluicegate": [run(19.0, [0.66, 0.7, 0.1]), run(11.0, [1.5, 1.5])],
    }
    rows = round_ratios(results, [1]).splitlines()
    assert rows[2] == "| 1 | 0.95x, 1.10x | 1.10x, 1.00x |"


def test_turns_pair_the_servers_per_level_and_alternate_who_goes_first() -> None:
    schedule = turns(2, [1, 16, 64])
    assert [(r, c) for r, c, _ in schedule] == [(0, 1), (0, 16), (0, 64), (1, 1), (1, 16), (1, 64)]
    vllm_first = [order == ("vllm", "sluicegate") for _, _, order in schedule]
    assert vllm_first == [True, False, True, False, True, False]
    # Every turn runs both servers once.
    assert all(sorted(order) == ["sluicegate", "vllm"] for _, _, order in schedule)
    # Over an even number of rounds, each level has each server first equally often.
    for level in (1, 16, 64):
        firsts = [order[0] for _, c, order in turns(4, [1, 16, 64]) if c == level]
        assert sorted(firsts) == ["sluicegate", "sluicegate", "vllm", "vllm"]
    for level in (1, 16):  # with an even number of levels too
        firsts = [order[0] for _, c, order in turns(2, [1, 16]) if c == level]
        assert sorted(firsts) == ["sluicegate", "vllm"]


def test_no_two_turns_share_prompts() -> None:
    seeds = [level_seed(r, c) for r, c, _ in turns(4, [1, 16, 64])]
    assert len(set(seeds)) == len(seeds)
    assert level_seed(0, 16) == 16  # the first round draws what earlier invocations drew
    assert 0 not in seeds  # the warm-up's seed


def test_waiting_for_a_server_ends_when_it_answers_or_exits() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}/", server, "file server", 30)
    finally:
        server.kill()
        server.wait()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    with pytest.raises(SystemExit, match="gone exited early"):
        wait_ready(f"http://127.0.0.1:{port}/", gone, "gone", 30)
