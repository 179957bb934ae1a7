"""A burst of streamed requests sent at once from a process of its own, as a user's client
would send them: what is timed is the gateway, not the test's process (late in a lane
pytest's process holds some 500,000 objects, and one of its full garbage collections took
0.47 s on a loaded two-core host: a pause its own clients would count as the gateway's). Each
answer carries its request id, by which `access_log.request_millis` finds the gateway's own
time for it (`tests/integration/test_engine_admission.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

# Sends every body of the JSON list on stdin at once, streamed, and prints a JSON object:
# "answers", one per body in order (status, seconds to the answer's head, Retry-After, error
# code, tokens streamed by the usage event's count, whether `[DONE]` came, the request id),
# and "late", how late the process's event loop ran at worst (a 10-ms sampler): a slow
# answer that the client itself was too starved to read is not the gateway's.
CLIENT = """
import asyncio, json, sys, time
import httpx

async def ask(client, body):
    started = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        took = time.perf_counter() - started
        answer = {"status": response.status_code, "took": took,
                  "retry_after": response.headers.get("retry-after"), "code": "",
                  "tokens": 0, "done": False,
                  "request_id": response.headers.get("x-request-id")}
        if response.status_code != 200:
            await response.aread()
            answer["code"] = response.json()["error"]["code"]
            return answer
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                answer["tokens"] = json.loads(line[6:])["usage"]["completion_tokens"]
            answer["done"] = answer["done"] or line == "data: [DONE]"
        return answer

async def sample(late):
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(0.01)
        late[0] = max(late[0], loop.time() - asked - 0.01)

async def main(url, bodies):
    late = [0.0]
    sampler = asyncio.create_task(sample(late))
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        answers = await asyncio.gather(*(ask(client, body) for body in bodies))
    sampler.cancel()
    print(json.dumps({"answers": answers, "late": late[0]}))

asyncio.run(main(sys.argv[1], json.load(sys.stdin)))
"""


@dataclass(frozen=True)
class Answer:
    status: int
    took: float
    """Seconds from sending to the answer's head, as the client saw them."""
    retry_after: str | None
    code: str
    """The error's code, for an answer that is not a 200."""
    tokens: int
    """Tokens streamed (the usage event's count: on a loaded machine vLLM hands a lagging
    reader several tokens in one delta, so chunks undercount them)."""
    done: bool
    request_id: str | None


@dataclass(frozen=True)
class Burst:
    answers: list[Answer]
    late: float
    """Seconds the client's event loop ran late at worst."""


def send_burst(url: str, bodies: list[dict[str, object]], timeout: float = 300) -> Burst:
    """Every body POSTed to `url`'s chat completions at once, streamed, from a process of
    its own."""
    sent = subprocess.run(
        [sys.executable, "-c", CLIENT, url],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert sent.returncode == 0, sent.stderr[-2000:]
    out = json.loads(sent.stdout)
    return Burst([Answer(**a) for a in out["answers"]], float(out["late"]))
