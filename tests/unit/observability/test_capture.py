"""The traffic capture over the app with the fake engine: what its file holds (and never
holds), its order, its bounds, and that `sluicegate tune` can read it back."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.cli import main
from sluicegate.engine.protocol import TemplateKwargs, Tools
from sluicegate.errors import EngineUnavailableError
from sluicegate.keys import key_id
from sluicegate.observability.traffic_format import BLOCK_SIZE, FIELDS
from sluicegate.tuning.profile import MIN_REQUESTS, read_profile
from tests.support.fakes import (
    FAKE_MODEL,
    FakeEngine,
    WhitespaceTokenizer,
    chat_body,
    fake_app,
    greedy_chat,
    serve_in_thread,
)
from tests.support.metrics import local_value

CHAT, COMPLETIONS, MESSAGES, RESPONSES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
)
CANARY_ID = 918_273_000
"""Every token id the canary tokenizer gives is this plus under 1,000: nine digits that no
time, count or block number of a small capture can spell."""
KEY = "sk-capture-canary-0123456789"


class CanaryTokenizer(WhitespaceTokenizer):
    """Each word is one token whose id is large and the word's own (the same word, the same
    id). A chat with the word `hold` waits for `release` (set from any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.release.set()
        self.held = threading.Event()

    @staticmethod
    def ids(text: str) -> list[int]:
        return [CANARY_ID + zlib.crc32(word.encode()) % 1000 for word in text.split()]

    async def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        text = " ".join(f"{m['role']} {m['content']}" for m in messages)
        if "hold" in text.split():
            self.held.set()
            assert await asyncio.to_thread(self.release.wait, 30)
        return self.ids(text)

    async def encode(self, text: str) -> list[int]:
        return self.ids(text)


def canary_engine(**fields: Any) -> FakeEngine:
    return FakeEngine(tokenizer=CanaryTokenizer(), max_model_len=512, **fields)


def words(count: int, tag: str = "w") -> str:
    """`count` distinct words (each one token)."""
    return " ".join(f"{tag}{i}" for i in range(count))


def captured(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header, *lines = (json.loads(line) for line in path.read_text().splitlines())
    return header, lines


def lines_total(outcome: str) -> float:
    return local_value("sluicegate_traffic_capture_lines_total", outcome=outcome)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "traffic.jsonl"


def serve(path: Path, engine: FakeEngine | None = None, **settings: object) -> TestClient:
    return TestClient(fake_app(engine or canary_engine(), traffic_capture=path, **settings))


def test_no_text_token_ids_request_ids_keys_or_addresses_reach_the_file(path: Path) -> None:
    canary = "zanzibar quokka marmalade"
    ids = CanaryTokenizer.ids(canary)
    headers = {"authorization": f"Bearer {KEY}"}
    request_ids = []
    engine = canary_engine()
    with serve(path, engine, api_keys=KEY) as client:
        bodies = {
            CHAT: chat_body(f"{canary} {words(40)}", max_tokens=8),
            COMPLETIONS: {"model": FAKE_MODEL, "prompt": f"{words(20)} {canary}", "max_tokens": 8},
            MESSAGES: {
                "model": FAKE_MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": canary}],
            },
            RESPONSES: {"model": FAKE_MODEL, "input": canary, "stream": True},
        }
        for route, body in bodies.items():
            response = client.post(route, json=body, headers=headers)
            assert response.status_code == 200, response.text
            request_ids.append(response.headers["x-request-id"])
    assert set(ids) <= set(engine.requests[0][1])  # the engine had the canary's ids
    text = path.read_text()
    header, lines = captured(path)
    assert [line["api"] for line in lines] == ["chat", "completions", "messages", "responses"]
    assert set(header) == {"format", "version", "block_size", "sample", "max_model_len"}
    assert all(set(line) == set(FIELDS) for line in lines)
    assert max(len(line["blocks"]) for line in lines) >= 2  # the prompts were long enough
    forbidden = [
        *canary.split(),
        *engine.words,  # the answer's
        FAKE_MODEL,
        str(CANARY_ID)[:6],
        *map(str, ids),
        *request_ids,
        KEY,
        key_id(hashlib.sha256(KEY.encode()).digest()),
        "127.0.0.1",
        "testclient",
    ]
    assert [found for found in forbidden if found in text] == []


def test_the_file_is_new_and_its_owners_alone(path: Path) -> None:
    with serve(path) as client:
        assert client.post(CHAT, json=chat_body()).status_code == 200
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_line_holds_what_the_request_asked_and_what_the_engine_did(path: Path) -> None:
    engine = canary_engine()
    with serve(path, engine, scheduling_policy="priority") as client:
        body = chat_body(words(35), max_tokens=2, stream=True, priority=3)
        assert client.post(CHAT, json=body).status_code == 200
        assert client.post(CHAT, json=chat_body(words(3), max_tokens=50)).status_code == 200
    _, (first, second) = captured(path)
    prompt = engine.requests[0][1]
    assert first["input_tokens"] == len(prompt) and len(prompt) >= 36
    assert len(first["blocks"]) == len(prompt) // BLOCK_SIZE  # full blocks only
    assert (first["output_tokens"], first["max_tokens"], first["finish_reason"]) == (
        2,
        2,
        "length",
    )
    assert (first["stream"], first["priority"], first["cache"]) == (True, 3, "BYPASS")
    assert (second["output_tokens"], second["finish_reason"]) == (3, "stop")
    assert not second["stream"]
    assert second["blocks"] == []  # under one block
    assert 0 == first["t"] <= second["t"]


def test_shared_prefixes_share_their_leading_blocks_and_only_those(path: Path) -> None:
    shared = words(40, "s")
    with serve(path) as client:
        for tail in ("a", "b", "a"):
            body = chat_body(f"{shared} {words(40, tail)}", max_tokens=1)
            assert client.post(CHAT, json=body).status_code == 200
    _, (one, two, three) = captured(path)
    # "user" and 40 shared words: the first two blocks of 16 are the same prefix.
    assert one["blocks"][:2] == two["blocks"][:2]
    assert set(one["blocks"][2:]).isdisjoint(two["blocks"][2:])
    assert one["blocks"] == three["blocks"]
    distinct = len(set(one["blocks"]) | set(two["blocks"]))
    assert sorted(set(one["blocks"]) | set(two["blocks"])) == list(range(1, distinct + 1))


def test_two_captures_number_the_same_traffic_alike(tmp_path: Path) -> None:
    blocks = []
    for name in ("one.jsonl", "two.jsonl"):
        with serve(tmp_path / name) as client:
            for tail in ("x", "y", "x"):
                body = chat_body(f"{words(20)} {words(30, tail)}", max_tokens=1)
                assert client.post(CHAT, json=body).status_code == 200
        blocks.append([line["blocks"] for line in captured(tmp_path / name)[1]])
    assert blocks[0] == blocks[1] and blocks[0][0] != blocks[0][1]


def test_each_engine_sequence_is_a_line(path: Path) -> None:
    with serve(path) as client:
        assert client.post(CHAT, json=chat_body(words(20), n=2, max_tokens=2)).status_code == 200
        body = {"model": FAKE_MODEL, "prompt": [words(17), words(40)], "max_tokens": 3}
        assert client.post(COMPLETIONS, json=body).status_code == 200
    _, lines = captured(path)
    assert len(lines) == 4
    assert lines[0] == lines[1] and lines[0]["output_tokens"] == 2
    assert [line["input_tokens"] for line in lines[2:]] == [17, 40]
    assert [len(line["blocks"]) for line in lines[2:]] == [1, 2]
    assert lines[2]["t"] == lines[3]["t"]


def test_cache_hits_are_not_captured(path: Path) -> None:
    with serve(path) as client:
        for _ in range(2):
            response = client.post(CHAT, json=greedy_chat(words(20), max_tokens=2))
            assert response.status_code == 200
        assert response.headers["x-cache"] == "HIT"
    _, lines = captured(path)
    assert [line["cache"] for line in lines] == ["MISS"]


def test_a_run_the_engine_refused_is_captured_unfinished(path: Path) -> None:
    engine = canary_engine(fail_before_output=EngineUnavailableError())
    with serve(path, engine) as client:
        assert client.post(CHAT, json=chat_body(words(20), max_tokens=4)).status_code == 503
        # Refused at admission (a priority without priority scheduling): before the lookup.
        refused = client.post(CHAT, json=chat_body("x", priority=7))
        assert refused.status_code == 400
    _, lines = captured(path)
    assert [(line["output_tokens"], line["finish_reason"]) for line in lines] == [(0, None)]


def test_a_capture_reads_back_as_a_profile(path: Path) -> None:
    with serve(path) as client:
        for index in range(MIN_REQUESTS):
            body = chat_body(f"{words(20)} {words(index % 7 + 1, 'q')}", max_tokens=3)
            assert client.post(CHAT, json=body).status_code == 200
    profile = read_profile(path)
    assert len(profile.requests) == MIN_REQUESTS
    assert profile.header == {"sample": 1.0, "max_model_len": 512}
    assert profile.shares_prefixes()
    assert main(["profile", "check", str(path)]) == 0


def test_sample_zero_writes_the_header_alone(path: Path) -> None:
    sampled_out = lines_total("sampled_out")
    with serve(path, traffic_capture_sample=0) as client:
        for _ in range(3):
            assert client.post(CHAT, json=chat_body(n=2)).status_code == 200
    header, lines = captured(path)
    assert lines == [] and header["sample"] == 0
    assert lines_total("sampled_out") == sampled_out + 6


def test_past_its_byte_bound_the_capture_stops_writing(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    over = lines_total("over_size")
    with serve(path, traffic_capture_max_bytes=4096) as client:
        for _ in range(40):
            assert client.post(CHAT, json=chat_body(words(20), max_tokens=2)).status_code == 200
    _, lines = captured(path)
    assert path.stat().st_size <= 4096
    assert 0 < len(lines) < 40
    assert lines_total("over_size") == over + 40 - len(lines)
    assert sum("TRAFFIC_CAPTURE_MAX_BYTES" in r.getMessage() for r in caplog.records) == 1


def test_lines_keep_the_arrival_order_when_a_later_request_ends_first(path: Path) -> None:
    tokenizer = CanaryTokenizer()
    tokenizer.release.clear()

    async def exchange(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = asyncio.create_task(
                http.post(CHAT, json=chat_body(f"hold {words(4)}", max_tokens=1))
            )
            assert await asyncio.to_thread(tokenizer.held.wait, 10)
            second = await http.post(CHAT, json=chat_body(words(30), max_tokens=2))
            assert second.status_code == 200 and not first.done()
            tokenizer.release.set()
            assert (await first).status_code == 200

    engine = FakeEngine(tokenizer=tokenizer, max_model_len=512)
    with serve_in_thread(fake_app(engine, traffic_capture=path)) as url:
        asyncio.run(exchange(url))
    _, lines = captured(path)
    assert [line["input_tokens"] for line in lines] == [6, 31]
    assert lines[0]["t"] < lines[1]["t"]
