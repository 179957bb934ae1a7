"""No single request stalls the others: while one hostile body up to the body limit is being
worked on, `/health` answers every probe within 100 ms (real engine, real HTTP).

The bodies are the worst cases of work proportional to input size: a long older turn of many
sentences (truncated), many very short sentences, content split into a quarter of a million
parts, 2,000 messages, a text completion prompt of megabytes, and 240,000 tiny messages (chat,
Responses items, /tokenize), refused for their number. Each is sent from a process of its
own, and `/health` is probed from another (`PROBE`), so that neither the upload nor the test
process's own pauses are counted as the gateway's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import MODEL_NAME, GatewayProcess

BODY_LIMIT = 8 * 1024 * 1024  # the default SLUICEGATE_MAX_REQUEST_BYTES
PROBE_EVERY_S = 0.05
WORST_PROBE_S = 0.1


def sentences(size: int, sentence: str = "The quick brown fox jumps over the lazy dog. ") -> str:
    return sentence * (size // len(sentence))


TOO_MANY = 240_000


def hostile_bodies() -> Iterator[tuple[str, str, dict[str, object]]]:
    size = BODY_LIMIT - 64 * 1024
    chat = "/v1/chat/completions"
    tail = [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Go on."}]
    yield (
        "long older turn",
        chat,
        {"messages": [{"role": "user", "content": sentences(size)}, *tail]},
    )
    yield (
        "short sentences",
        chat,
        {"messages": [{"role": "user", "content": "Hi. " * (size // 4)}, *tail]},
    )
    parts = [{"type": "text", "text": "word. "}] * (size // 36)
    yield "content parts", chat, {"messages": [{"role": "user", "content": parts}, *tail]}
    count = 2000
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": sentences(size // count - 48)}
        for i in range(count - 1)
    ]
    yield "many messages", chat, {"messages": [*turns, {"role": "user", "content": "Go on."}]}
    yield "long prompt", "/v1/completions", {"prompt": sentences(size)}
    tiny = [{"role": "user", "content": ""}] * TOO_MANY
    yield "too many messages", chat, {"messages": tiny}
    yield "too many input items", "/v1/responses", {"input": tiny}
    yield "too many messages to tokenize", "/tokenize", {"messages": tiny}


# Where a body is refused whole, the parameter named.
REFUSED_PARAM = {
    "too many messages": "messages",
    "too many input items": "input",
    "too many messages to tokenize": "messages",
}


# `/health` every `interval` seconds from a process of its own, until the file `stop` exists:
# what is timed is the gateway, not the test's process (late in a full run pytest's process
# is large and busy, and its pauses were once counted as the gateway's). Prints "probing"
# when it starts, then at the end each probe's start (monotonic clock, shared by processes
# on Linux), time taken and status, as JSON.
PROBE = """
import json, os, sys, time
import httpx
url, stop, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
probes = []
with httpx.Client(base_url=url, timeout=60) as client:
    print("probing", flush=True)
    while not os.path.exists(stop):
        at = time.monotonic()
        started = time.perf_counter()
        status = client.get("/health").status_code
        probes.append((at, time.perf_counter() - started, status))
        time.sleep(interval)
print(json.dumps(probes))
"""


def lag_samples_over(url: str, seconds: str) -> float:
    """How many of the gateway's own loop-lag observations were above `seconds`."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    buckets = {}
    for line in text.splitlines():
        if line.startswith("sluicegate_event_loop_lag_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets[bound] = float(line.rsplit(" ", 1)[1])
    return buckets["+Inf"] - buckets[seconds]


@pytest.mark.parametrize("name", [name for name, _, _ in hostile_bodies()])
def test_health_answers_within_100_ms_while_a_hostile_body_is_worked_on(
    name: str, gateway: GatewayProcess, tmp_path: Path
) -> None:
    path, body = next((p, b) for n, p, b in hostile_bodies() if n == name)
    payload = json.dumps({"model": MODEL_NAME, "max_tokens": 1, **body}).encode()
    assert BODY_LIMIT / 2 < len(payload) <= BODY_LIMIT
    body_file = tmp_path / "body.json"
    body_file.write_bytes(payload)
    send = (
        "import httpx, sys; "
        f"r = httpx.post({gateway.url + path!r}, content=open({str(body_file)!r}, 'rb').read(), "
        "headers={'content-type': 'application/json'}, timeout=300); "
        "print(r.status_code); print(r.text[:300])"
    )
    stalls_before = lag_samples_over(gateway.url, "0.1")
    stop = tmp_path / "stop"
    with subprocess.Popen(
        [sys.executable, "-c", PROBE, gateway.url, str(stop), str(PROBE_EVERY_S)],
        stdout=subprocess.PIPE,
        text=True,
    ) as prober:
        assert prober.stdout is not None
        assert prober.stdout.readline().strip() == "probing"
        began = time.monotonic()
        sender = subprocess.run([sys.executable, "-c", send], capture_output=True, text=True)
        ended = time.monotonic()
        stop.touch()
        probes = json.loads(prober.stdout.read())
    # The probes made while the hostile request was being sent and worked on.
    waits = [wait for at, wait, status in probes if began <= at <= ended and status == 200]
    assert len(waits) == len([p for p in probes if began <= p[0] <= ended])
    status, _, answer = sender.stdout.partition("\n")
    print(f"{name}: {len(waits)} probes, worst {max(waits, default=0) * 1000:.0f} ms, {status}")
    # The request itself is answered: a completion, or (the prompt cannot fit) a clean 400.
    assert status in ("200", "400"), answer
    if name in REFUSED_PARAM:
        assert status == "400" and json.loads(answer)["error"]["param"] == REFUSED_PARAM[name]
    elif status == "400":
        assert json.loads(answer)["error"]["code"] == "context_length_exceeded"
    assert len(waits) >= 3, "the request was too quick to probe"
    stalls = lag_samples_over(gateway.url, "0.1") - stalls_before
    worst = max(waits)
    assert worst <= WORST_PROBE_S, (
        f"{name}: /health waited {worst * 1000:.0f} ms, probe {waits.index(worst) + 1} of "
        f"{len(waits)}; the gateway's own loop-lag samples over 100 ms meanwhile: {stalls:g}"
    )
    assert stalls == 0
