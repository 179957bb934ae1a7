"""The fault-injecting upstream (tests/support/fault_upstream.py), itself a test double,
driven as the gateway's integration tests drive it: a real process on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.fault_upstream import ControlError, FaultUpstreamProcess, parse_control, start

CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "two words"}]}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("fault") / "upstream.log"
    process = start(0, "--chunks", "5", "--api-key", "sk-up", log=log)
    yield process
    process.stop()


@pytest.fixture
def http(upstream: FaultUpstreamProcess) -> Iterator[httpx.Client]:
    upstream.control(reset_all=True)
    with httpx.Client(base_url=upstream.url, headers={"Authorization": "Bearer sk-up"}) as client:
        yield client


def events(lines: Iterator[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def test_a_stream_has_a_word_per_chunk_a_finish_reason_usage_and_done(http: httpx.Client) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        data = events(response.iter_lines())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    words = [c["choices"][0]["delta"]["content"] for c in chunks[1:6]]
    assert words == ["Water", " finds", " the", " open", " sluice"]
    assert chunks[6]["choices"][0]["finish_reason"] == "stop"
    assert chunks[7] == {**chunks[7], "choices": [], "usage": {
        "prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}}  # fmt: skip
    assert len({c["id"] for c in chunks}) == 1


def test_max_tokens_cuts_the_answer_with_finish_reason_length(http: httpx.Client) -> None:
    body = http.post("/completions", json={"prompt": "a b c", "max_tokens": 2}).json()
    assert body["choices"][0]["text"] == "Water finds"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_the_api_key_is_required_on_v1_but_not_on_health(upstream: FaultUpstreamProcess) -> None:
    assert httpx.get(f"{upstream.url}/models").status_code == 401
    assert httpx.get(f"{upstream.root}/health").status_code == 200


def test_a_status_fault_answers_n_requests_with_retry_after_then_heals(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(status=503, retry_after=1, times=2)
    answers = [http.post("/chat/completions", json=CHAT) for _ in range(3)]
    assert [a.status_code for a in answers] == [503, 503, 200]
    assert answers[0].headers["retry-after"] == "1"
    assert set(answers[0].json()["error"]) == {"message", "type", "param", "code"}
    assert http.get("/models").status_code == 200  # status faults spare the other routes


def test_the_answer_can_be_shaped_and_retry_after_sent_as_it_is(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(status=503, retry_after="inf", times=1)
    assert http.post("/chat/completions", json=CHAT).headers["retry-after"] == "inf"
    upstream.control(words=["a\x1eb", " c"], chunk_bytes=4)
    body = http.post("/chat/completions", json=CHAT).json()
    assert body["choices"][0]["message"]["content"] == "a\x1ebx cxx"
    upstream.control(reset_stats=True, chunks=7)
    stream = {**CHAT, "stream": True, "priority": 5}
    with http.stream("POST", "/chat/completions", json=stream) as response:
        data = events(response.iter_lines())
    assert len(data) == 1 + 7 + 1 + 1  # the role, 7 words, the finish, [DONE]
    stats = upstream.stats()
    assert stats["priorities"] == {"5": 1}
    assert stats["sent_bytes"] == sum(len(f"data: {d}\n\n") for d in data[:-1])


def test_a_reset_before_the_headers_is_a_connection_reset(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(reset="before", times=1)
    with pytest.raises(httpx.ReadError, match="reset"):
        http.post("/chat/completions", json=CHAT)
    assert upstream.stats()["resets"] >= 1
    assert http.post("/chat/completions", json=CHAT).status_code == 200


def test_a_reset_during_the_stream_comes_after_the_chunks_asked_for(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(reset="during", after_chunks=3)
    resets = upstream.stats()["resets"]
    received: list[str] = []
    with (
        pytest.raises(httpx.ReadError, match="reset"),
        http.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            received += events(iter([line]))
    assert len(received) == 3
    assert upstream.stats()["resets"] == resets + 1


def test_a_client_leaving_a_stall_is_seen_at_once_and_counted(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(stall=30)
    before = upstream.stats()
    with pytest.raises(httpx.ReadTimeout):
        http.post("/chat/completions", json=CHAT, timeout=0.3)
    left = time.monotonic()
    deadline = left + 5
    while len((stats := upstream.stats())["disconnects"]) == len(before["disconnects"]):
        assert time.monotonic() < deadline, "the disconnect was not noticed"
        time.sleep(0.02)
    noticed = stats["disconnects"][-1]
    # One clock for both processes. At once: within milliseconds of the client closing,
    # which is just before `left`; the room is for a loaded machine, far under the stall.
    assert left - 1 < noticed < left + 3, (noticed - left, stats)
    assert stats["in_flight"] == 0  # the stalled answer was abandoned
    assert stats["completed"] == before["completed"]


def test_open_connections_and_in_flight_are_live(upstream: FaultUpstreamProcess) -> None:
    upstream.control(stall=30)
    base = upstream.stats()["open_connections"]
    clients = [httpx.Client(headers={"Authorization": "Bearer sk-up"}) for _ in range(2)]
    try:
        for client in clients:
            with pytest.raises(httpx.ReadTimeout):
                client.post(f"{upstream.url}/completions", json={"prompt": "x"}, timeout=0.2)
        upstream.control(reset_all=True)
        # The clients closed the timed-out connections: none is open or in flight once the
        # upstream has seen the closes (polled: a loaded machine may take longer than 0.1 s).
        deadline = time.monotonic() + 5
        while (stats := upstream.stats())["in_flight"] or stats["open_connections"] != base:
            assert time.monotonic() < deadline, stats
            time.sleep(0.02)
        kept = clients[0].get(f"{upstream.url}/models")  # a keep-alive connection stays open
        assert kept.status_code == 200
        assert upstream.stats()["open_connections"] == base + 1
    finally:
        for client in clients:
            client.close()


def test_down_fails_health_and_models_too(upstream: FaultUpstreamProcess) -> None:
    upstream.control(down=True)
    assert httpx.get(f"{upstream.root}/health").status_code == 503
    assert httpx.get(f"{upstream.url}/models").status_code == 503
    upstream.control(reset_all=True)
    assert httpx.get(f"{upstream.root}/health").status_code == 200


def test_stats_count_requests_per_path_and_arrivals_name_their_fault(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(reset_stats=True, status=429, times=1)
    http.post("/chat/completions", json=CHAT)
    http.post("/completions", json={"prompt": "x"})
    stats = upstream.stats()
    assert stats["requests"] == {"/v1/chat/completions": 1, "/v1/completions": 1}
    assert stats["statuses"] == {"429": 1, "200": 1}
    assert stats["models"] == {"fault-model": 1}  # the completion named none
    assert [a["fault"] for a in stats["arrivals"]] == ["status", None]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"status": 200}, "status must be"),
        ({"reset": "sideways"}, "reset must be"),
        ({"reset": "during"}, "needs after_chunks"),
        ({"status": 503, "stall": 1}, "choose one"),
        ({"retry_after": 1}, "goes with status"),
        ({"times": 2}, "no behaviour"),
        ({"slow": True}, "slow must be"),
        ({"color": "red"}, "unknown control fields: color"),
        ({"words": []}, "words must be"),
        ({"status": 503, "retry_after": ""}, "printable header value"),
        ({"chunk_bytes": 0}, "chunk_bytes must be"),
    ],
)
def test_bad_control_bodies_say_why(body: dict[str, object], reason: str) -> None:
    with pytest.raises(ControlError, match=reason):
        parse_control(body)


def test_a_bad_control_body_is_a_400_and_changes_nothing(upstream: FaultUpstreamProcess) -> None:
    upstream.control(slow=0.01)
    response = httpx.post(f"{upstream.root}/_control", json={"status": "teapot"})
    assert response.status_code == 400
    assert httpx.get(f"{upstream.root}/_control").json() == {"slow": 0.01}


def test_connections_accepted_tells_a_reused_connection_from_new_ones(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(reset_stats=True)
    for _ in range(3):
        http.post("/completions", json={"prompt": "x"})
    assert http.get(f"{upstream.root}/_stats").json()["connections_accepted"] == 1
    httpx.get(f"{upstream.root}/health")  # a client of its own: a connection of its own
    assert http.get(f"{upstream.root}/_stats").json()["connections_accepted"] == 2


def test_reasoning_comes_before_the_words_as_vllms_server_writes_it(
    upstream: FaultUpstreamProcess, http: httpx.Client
) -> None:
    upstream.control(reasoning=["Two", " and two."])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 2}
    with http.stream("POST", "/chat/completions", json=body) as response:
        chunks = [json.loads(d) for d in events(response.iter_lines())[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[1:5] == [
        {"reasoning": "Two"},
        {"reasoning": " and two."},
        {"content": "Water"},
        {"content": " finds"},
    ]
    details = {"reasoning_tokens": 2}
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6,
        "completion_tokens_details": details}  # fmt: skip
    whole = http.post("/chat/completions", json={**CHAT, "max_tokens": 2}).json()
    assert whole["choices"][0]["message"] == {
        "role": "assistant", "content": "Water finds", "reasoning": "Two and two."}  # fmt: skip
    assert whole["usage"]["completion_tokens_details"] == details
    # Text completions have no thoughts; the bodies asked are kept for tests to read.
    text = http.post("/completions", json={"prompt": "a", "max_tokens": 2}).json()
    assert text["choices"][0]["text"] == "Water finds"
    assert "completion_tokens_details" not in text["usage"]
    assert upstream.stats()["bodies"][-1] == {"prompt": "a", "max_tokens": 2}
