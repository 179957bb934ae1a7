"""The baseline for bench/cache_hits.py: a bare FastAPI endpoint returning constant JSON.

Served on the same stack as sluicegate (uvicorn, uvloop, httptools, one process, no access
log), so the difference between the two is what the gateway does on a cache hit. With a
second argument, that many uvicorn workers (bench/workers.py).
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI

BODY = {
    "id": "chatcmpl-0",
    "object": "chat.completion",
    "created": 0,
    "model": "SmolLM2-135M-Instruct",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "A river is a natural stream of water."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 16, "total_tokens": 56},
}

app = FastAPI()


@app.post("/v1/chat/completions")
async def constant() -> dict[str, object]:
    return BODY


if __name__ == "__main__":
    # `bare_app.py PORT [WORKERS]`: with several, uvicorn's workers share the port.
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    uvicorn.run(
        app if workers == 1 else "bare_app:app",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        workers=workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
