"""`/health` probed from a process of its own while a request is sent from another, and the
gateway's own loop-lag histogram read around it: how the tests prove that one request's work
stalls no other (`tests/integration/test_loop_lag.py`, `test_media.py`)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PROBE_EVERY_S = 0.05


# `/health` every `interval` seconds from a process of its own, until the file `stop` exists:
# what is timed is the gateway, not the test's process (late in a full run pytest's process
# is large and busy, and its pauses were once counted as the gateway's). Prints "probing"
# when it starts, then at the end each probe's start (monotonic clock, shared by processes
# on Linux), time taken and status, as JSON; and on stderr how late it woke from its sleeps
# at worst (the probing process starved of the CPU: a cause of a slow probe that is not the
# gateway's).
PROBE = """
import json, os, sys, time
import httpx
url, stop, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
probes = []
late = 0.0
with httpx.Client(base_url=url, timeout=60) as client:
    print("probing", flush=True)
    while not os.path.exists(stop):
        at = time.monotonic()
        started = time.perf_counter()
        status = client.get("/health").status_code
        probes.append((at, time.perf_counter() - started, status))
        asleep = time.perf_counter()
        time.sleep(interval)
        late = max(late, time.perf_counter() - asleep - interval)
print(json.dumps(probes))
print(f"{late:.4f}", file=sys.stderr)
"""


def lag_buckets(url: str) -> dict[str, float]:
    """The gateway's own loop-lag histogram: cumulative count per bucket bound."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    buckets = {}
    for line in text.splitlines():
        if line.startswith("sluicegate_event_loop_lag_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets[bound] = float(line.rsplit(" ", 1)[1])
    return buckets


def samples_over(before: dict[str, float], after: dict[str, float], bound: str) -> float:
    """How many loop-lag samples between the two readings were above `bound` seconds."""
    return (after["+Inf"] - after[bound]) - (before["+Inf"] - before[bound])


def longest_silence(probes: list[list[float]], began: float, ended: float) -> float:
    """The longest time between `began` and `ended` that `/health` went without answering a
    probe (the probe interval included): a stall of the gateway shows as one this long, and
    so would a probe that was never made. Needs no minimum number of probes: a request
    quicker than the bound cannot have stalled the gateway for longer."""
    answers = sorted(at + wait for at, wait, _ in probes if began < at + wait < ended)
    points = [began, *answers, ended]
    return max(b - a for a, b in itertools.pairwise(points))


@dataclass(frozen=True)
class Probed:
    status: str
    """The sent request's status code, as text."""
    answer: str
    """The first 300 characters of its body."""
    probes: list[list[float]]
    began: float
    ended: float
    probe_late: float = 0.0
    """Seconds the probing process woke late from its sleeps at worst."""


def probe_while_sending(url: str, path: str, body: Path, folder: Path) -> Probed:
    """POST the JSON file `body` to `url + path` from a process of its own while another
    probes `/health` every `PROBE_EVERY_S`."""
    send = (
        "import httpx; "
        f"r = httpx.post({url + path!r}, content=open({str(body)!r}, 'rb').read(), "
        "headers={'content-type': 'application/json'}, timeout=300); "
        "print(r.status_code); print(r.text[:300])"
    )
    stop = folder / "stop"
    with subprocess.Popen(
        [sys.executable, "-c", PROBE, url, str(stop), str(PROBE_EVERY_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as prober:
        assert prober.stdout is not None
        assert prober.stdout.readline().strip() == "probing"
        began = time.monotonic()
        sender = subprocess.run([sys.executable, "-c", send], capture_output=True, text=True)
        ended = time.monotonic()
        stop.touch()
        probes = json.loads(prober.stdout.read())
        late = (prober.stderr.read() if prober.stderr else "").strip().splitlines()
    status, _, answer = sender.stdout.partition("\n")
    return Probed(status, answer, probes, began, ended, float(late[-1]) if late else 0.0)
