"""The response cache on the real engine, with the default in-process store: hits through the
official SDK, stream replay, canonical keys, and single flight counted on the engine side."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
from openai import OpenAI

from tests.support.gateway import MODEL_NAME
from tests.support.metrics import metric_value
from tests.support.sse import sse_payloads

GENERATED = "vllm:request_success_total"


def question() -> list[dict[str, str]]:
    # A prompt no other test (or earlier run against a shared store) has sent.
    return [
        {"role": "user", "content": f"In one sentence, what is a river? ({uuid.uuid4().hex[:8]})"}
    ]


def test_repeat_is_served_from_the_cache_through_the_sdk(base_url: str) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = question()
    before = metric_value(base_url, GENERATED)
    raw = [
        client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=messages,
            temperature=0,
            max_tokens=24,  # type: ignore[arg-type]
        )
        for _ in range(2)
    ]
    assert [r.headers["x-cache"] for r in raw] == ["MISS", "HIT"]
    assert "age" in raw[1].headers and "age" not in raw[0].headers
    first, second = (r.parse() for r in raw)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage == first.usage and first.usage is not None
    assert first.usage.completion_tokens > 0
    assert metric_value(base_url, GENERATED) - before == 1


def test_stream_replay_equals_the_live_stream_and_serves_plain_requests(base_url: str) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": question(),
        "temperature": 0,
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(base_url=base_url, timeout=120) as http:
        live = http.post("/v1/chat/completions", json=body)
        replay = http.post("/v1/chat/completions", json=body)
        del body["stream"], body["stream_options"]
        plain = http.post("/v1/chat/completions", json=body)
    assert (live.headers["x-cache"], replay.headers["x-cache"]) == ("MISS", "HIT")
    events = sse_payloads(replay.text)
    assert events == sse_payloads(live.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for e in events[1:-3] if e["choices"][0]["delta"].get("content")) > 1
    assert events[-3]["choices"][0]["finish_reason"] in {"stop", "length"}
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert plain.headers["x-cache"] == "HIT"
    assert plain.json()["choices"][0]["message"]["content"] == text
    assert plain.json()["usage"] == events[-2]["usage"]


def test_json_layout_does_not_change_the_key(base_url: str) -> None:
    body = {"model": MODEL_NAME, "messages": question(), "temperature": 0, "max_tokens": 6}
    layouts = [
        json.dumps(body, separators=(",", ":")),
        json.dumps(dict(reversed(list(body.items()))), indent=4),
    ]
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=base_url, timeout=120) as http:
        outcomes = [
            http.post("/v1/chat/completions", content=c, headers=headers).headers["x-cache"]
            for c in layouts
        ]
    assert outcomes == ["MISS", "HIT"]


async def test_fifty_identical_requests_cause_one_engine_generation(base_url: str) -> None:
    body = {"model": MODEL_NAME, "messages": question(), "temperature": 0, "max_tokens": 48}
    before = metric_value(base_url, GENERATED)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        responses = await asyncio.gather(
            *(
                http.post("/v1/chat/completions", json={**body, "stream": i % 2 == 0})
                for i in range(50)
            )
        )
    assert [r.status_code for r in responses] == [200] * 50
    assert metric_value(base_url, GENERATED) - before == 1
    assert sorted(r.headers["x-cache"] for r in responses) == ["HIT"] * 49 + ["MISS"]


async def test_an_identical_stream_attaches_to_the_live_generation(base_url: str) -> None:
    """The follower starts while the leader is generating: it gets the leader's output live
    (its first words before the leader is done), the engine runs once, both streams match."""
    body = {
        "model": MODEL_NAME,
        "messages": question(),
        "temperature": 0,
        "max_tokens": 96,
        "ignore_eos": True,  # long enough to overlap, on any machine
        "stream": True,
    }
    before = metric_value(base_url, GENERATED)
    loop = asyncio.get_running_loop()
    follower_started = asyncio.Event()

    async def read(http: httpx.AsyncClient, leads: bool) -> tuple[str, float | None, float]:
        text, first_content = "", None
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                text += line + "\n"
                if first_content is None and '"content":"' in line and '"role"' not in line:
                    first_content = loop.time()
                    if leads:
                        follower_started.set()
        return text, first_content, loop.time()

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        leader = asyncio.create_task(read(http, leads=True))
        await follower_started.wait()
        follower = await read(http, leads=False)
        lead = await leader
    assert metric_value(base_url, GENERATED) - before == 1
    assert sse_payloads(follower[0]) == sse_payloads(lead[0])
    assert sse_payloads(lead[0])[-1] == "[DONE]"
    assert sse_payloads(lead[0])[-2]["choices"][0]["finish_reason"] == "length"
    # Live: the follower had content while the leader was still generating.
    assert follower[1] is not None and follower[1] < lead[2]
