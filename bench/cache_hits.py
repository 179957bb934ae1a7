"""The cache-hit path against a bare FastAPI endpoint on the same uvicorn stack, one run.

A real sluicegate gateway (real engine) is given N distinct cached prompts; wrk then drives
it at concurrency 32 with those prompts, round robin, and drives `bench/bare_app.py` (constant
JSON, same uvicorn/uvloop/httptools stack) with the same load, alternating A B / B A over the
rounds. Reported: req/s, P50 and P99 latency of each, and the ratios; also the streaming hit
path, and a streaming hit's time to first byte measured one request at a time.

    .venv/bin/python bench/cache_hits.py                          # in-process store
    .venv/bin/python bench/cache_hits.py --redis-url redis://127.0.0.1:6379/0

Needs `wrk` (Debian package; `make bench-cache` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.gateway import MODEL_NAME, free_port, start_gateway  # noqa: E402

WRK_SCRIPT = """
local bodies = {%s}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", "/v1/chat/completions",
                    {["Content-Type"] = "application/json"%s}, bodies[i])
end
"""


def bodies(count: int, stream: bool, tag: str) -> list[str]:
    return [
        json.dumps(
            {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": f"Name a river, please ({tag}-{i})."}],
                "temperature": 0,
                "max_tokens": 16,
                "stream": stream,
            }
        )
        for i in range(count)
    ]


def wrk(
    url: str, payloads: list[str], concurrency: int, duration: int, key: str | None = None
) -> dict[str, float]:
    """wrk's requests per second, P50 and P99 (ms) and request count, the payloads round
    robin, with `key` as the bearer key when given."""
    auth = "" if key is None else f', ["Authorization"] = "Bearer {key}"'
    lua = WRK_SCRIPT % (", ".join(json.dumps(p) for p in payloads), auth)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua)
    try:
        out = subprocess.run(
            ["wrk", "-t1", f"-c{concurrency}", f"-d{duration}s", "--latency", "-s", script.name,
             url],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        os.unlink(script.name)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    if errors or socket_errors:
        raise SystemExit(f"wrk saw errors against {url}:\n{out}")
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": _percentile(out, 50),
        "p99": _percentile(out, 99),
        "requests": float(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
    }


def _percentile(out: str, percent: int) -> float:
    """A line of wrk's latency distribution, in ms. Anchored at the line's start: a "+/- Stdev"
    column such as "87.50%" would match a bare `50%`."""
    found = re.search(rf"^\s*{percent}%\s+(\S+)\s*$", out, re.MULTILINE)
    if found is None:
        raise SystemExit(f"no {percent}% line in wrk's output:\n{out}")
    return _ms(found.group(1))


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def time_to_first_byte(port: int, payload: str, count: int) -> list[float]:
    """Milliseconds from sending a streaming request to its first body bytes, one at a time."""
    body = payload.encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    samples = []
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            started = time.perf_counter()
            sock.sendall(request)
            received = b""
            while b"data: " not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    raise SystemExit("connection closed before the first event")
                received += chunk
            samples.append((time.perf_counter() - started) * 1000)
            if b"200 OK" not in received.split(b"\r\n", 1)[0] or b"x-cache: HIT" not in received:
                raise SystemExit(f"not a streamed hit: {received[:300]!r}")
    return samples


def seed(url: str, payloads: list[str]) -> None:
    """Each prompt once (a miss), then until it hits: a Redis operation slower than its
    timeout on a busy machine makes a miss (and the cache leaves Redis alone for a second)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for payload in payloads:
            outcomes = []
            while len(outcomes) < 4 and outcomes[-1:] != ["HIT"]:
                if outcomes:
                    time.sleep(1.2)
                response = client.post(
                    "/v1/chat/completions",
                    content=payload,
                    headers={"content-type": "application/json"},
                )
                response.raise_for_status()
                outcomes.append(response.headers["x-cache"])
            if outcomes[0] != "MISS" or outcomes[-1] != "HIT":
                raise SystemExit(f"expected a miss, then a hit; got {outcomes}")
            if len(outcomes) > 2:
                print(f"seeding: a hit after {outcomes}", file=sys.stderr)


def start_bare(port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "bare_app.py"), str(port), str(workers)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=ROOT / "bench",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("bare app did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="distinct cached prompts")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ttfb-requests", type=int, default=300)
    parser.add_argument("--redis-url", help="run the gateway's cache on this Redis")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk, or `make bench-cache`)")

    tag = uuid.uuid4().hex[:8]
    env = {"SLUICEGATE_REDIS_URL": args.redis_url} if args.redis_url else {}
    log_dir = Path(tempfile.mkdtemp(prefix="cache-bench-"))
    gateway = start_gateway(log_dir, env=env)
    bare_port = free_port()
    bare = start_bare(bare_port)
    try:
        plain, streamed = bodies(args.prompts, False, tag), bodies(args.prompts, True, tag + "s")
        seed(gateway.url, plain)
        seed(gateway.url, streamed)
        targets = {"gateway": gateway.url, "bare": f"http://127.0.0.1:{bare_port}"}
        runs: dict[str, list[dict[str, float]]] = {"gateway": [], "bare": [], "stream": []}
        for round_ in range(args.rounds):
            order = ["gateway", "bare"] if round_ % 2 == 0 else ["bare", "gateway"]
            for name in order:
                url = targets[name] + "/v1/chat/completions"
                runs[name].append(wrk(url, plain, args.concurrency, args.duration))
            runs["stream"].append(
                wrk(gateway.url + "/v1/chat/completions", streamed, args.concurrency,
                    args.duration)
            )  # fmt: skip
        ttfb = time_to_first_byte(gateway.port, streamed[0], args.ttfb_requests)
    finally:
        bare.kill()
        gateway.stop()

    med = {k: {m: statistics.median(r[m] for r in v) for m in ("rps", "p50", "p99")}
           for k, v in runs.items()}  # fmt: skip
    store = "Redis" if args.redis_url else "in-process"
    print(
        f"\ncache hits ({store} store), concurrency {args.concurrency}, {args.prompts} "
        f"prompts, {args.rounds} rounds x {args.duration} s, medians\n"
    )
    print("| target | req/s | P50 ms | P99 ms |\n|---|---|---|---|")
    rows = (("bare FastAPI endpoint", "bare"), ("sluicegate, hit", "gateway"),
            ("sluicegate, streamed hit", "stream"))  # fmt: skip
    for label, key in rows:
        m = med[key]
        print(f"| {label} | {m['rps']:.0f} | {m['p50']:.2f} | {m['p99']:.2f} |")
    ratio = med["gateway"]["rps"] / med["bare"]["rps"]
    stream_ratio = med["stream"]["rps"] / med["bare"]["rps"]
    print(f"| **hit / bare** | **{ratio:.2f}x** | | |")
    print(f"| **streamed hit / bare** | **{stream_ratio:.2f}x** | | |")
    q = statistics.quantiles(ttfb, n=100)
    print(f"\nstreamed hit, time to first byte, one at a time ({len(ttfb)} requests): "
          f"P50 {statistics.median(ttfb):.2f} ms, P99 {q[98]:.2f} ms")  # fmt: skip
    results = {
        "median": med,
        "ratio": ratio,
        "stream_ratio": stream_ratio,
        "ttfb_ms": ttfb,
        "args": vars(args),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"cache-hits-{store.lower()}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
