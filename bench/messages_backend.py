"""Anthropic's Messages API as a backend of vLLM's benchmark module (`anthropic-messages`).

vLLM's `vllm.benchmarks.serve` measures OpenAI's APIs only; registering this request
function lets `compare_vllm.py --api messages` drive `/v1/messages` with the same datasets,
concurrency and metrics as its chat runs. The request is one user turn, streamed and greedy
(`temperature: 0`: Anthropic's API has no `ignore_eos`, so both servers answer the same
tokens and stop at the same place); its time to first token is the first
`content_block_delta`'s, and its token counts are the ones `message_start` and
`message_delta` report.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import (
    ASYNC_REQUEST_FUNCS,
    RequestFuncInput,
    RequestFuncOutput,
)

BACKEND = "anthropic-messages"


async def request_messages(
    request_func_input: RequestFuncInput, session: aiohttp.ClientSession, pbar: Any | None = None
) -> RequestFuncOutput:
    request = request_func_input
    payload = {
        "model": request.model_name or request.model,
        "messages": [{"role": "user", "content": request.prompt}],
        "max_tokens": request.output_len,
        "temperature": 0,
        "stream": True,
    }
    output = RequestFuncOutput()
    output.prompt_len = request.prompt_len
    start = last = time.perf_counter()
    output.start_time = start
    text: list[str] = []
    try:
        async with session.post(request.api_url, json=payload) as response:
            if response.status != 200:
                output.error = f"{response.status}: {await response.text()}"
                return output
            async for kind, data in _events(response):
                now = time.perf_counter()
                if kind == "content_block_delta":
                    if not text:
                        output.ttft = now - start
                    else:
                        output.itl.append(now - last)
                    last = now
                    text.append(data["delta"].get("text") or "")
                elif kind == "message_start":
                    output.prompt_len = data["message"]["usage"]["input_tokens"]
                elif kind == "message_delta":
                    output.output_tokens = data["usage"]["output_tokens"]
                elif kind == "error":
                    output.error = json.dumps(data)
                    return output
        output.generated_text = "".join(text)
        output.latency = last - start
        output.success = bool(text)
        if not output.success:
            output.error = "no content_block_delta in the stream"
    except Exception:
        output.error = "".join(traceback.format_exception(*sys.exc_info()))
    finally:
        if pbar is not None:
            pbar.update(1)
    return output


async def _events(response: aiohttp.ClientResponse) -> Any:
    """`(event type, data)` per server-sent event; pings and comments skipped."""
    buffer = ""
    async for chunk in response.content.iter_any():
        buffer += chunk.decode()
        while "\n\n" in buffer:
            message, buffer = buffer.split("\n\n", 1)
            data = [line[5:].lstrip() for line in message.split("\n") if line.startswith("data:")]
            if not data:
                continue
            event = json.loads("\n".join(data))
            if event.get("type") != "ping":
                yield event["type"], event


def register() -> None:
    """Make `anthropic-messages` a `--backend` of vLLM's benchmark (before its parser is
    built: the choices are the table's keys)."""
    ASYNC_REQUEST_FUNCS[BACKEND] = request_messages
