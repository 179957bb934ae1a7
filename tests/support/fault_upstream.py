"""A fault-injecting OpenAI-compatible upstream: a test double, not a model server.

It answers the OpenAI routes a gateway calls with canned words, one word per streamed
chunk, and does on command what a failing server does: error statuses with `Retry-After`,
connections reset before the headers or mid-stream, stalls, slow streams, or being down.
A real HTTP server process (uvicorn, uvloop, raw ASGI; chunk bytes precomputed), so it also
serves as the fast streaming upstream of `bench/upstream_overhead.py`.

    python -m tests.support.fault_upstream --port 8101 [--fd N] [--chunks 32] [--delay 0]
        [--model fault-model] [--api-key KEY] [--tokenize] [--max-model-len 2048]

Routes: `GET /health` (200, empty), `GET /v1/models`, `POST /v1/chat/completions` and
`POST /v1/completions`, streamed (`data: {...}` chat.completion.chunk / text_completion
events, the last with `finish_reason`, a usage event when `stream_options.include_usage`,
then `data: [DONE]`) or not (one body with `usage`). `max_tokens` (or
`max_completion_tokens`) below `--chunks` cuts the answer there, with finish_reason
`length`. With `--api-key`, `/v1/*` wants `Authorization: Bearer KEY` (else 401).

With `--tokenize`, `POST /tokenize` answers in vLLM's shape (`{"count", "max_model_len",
"tokens", "token_strs"}`) for a `prompt` or chat `messages`, with a toy tokenizer (words in
pieces of up to 4 characters, each punctuation mark, each run of whitespace, and the chat
template's markers are tokens), and the completion routes count prompts with it: their
usage says so, and a prompt that leaves less than `max_tokens` of `--max-model-len` gets
vLLM's 400. `/_stats`' `requests["/tokenize"]` counts the calls. Without it, `/tokenize` is
a 404, as on llama.cpp's or Ollama's server.

Control, `POST /_control` with one JSON object, replacing the behaviour before it:

    {"status": 503, "retry_after": 1}      that status and an OpenAI error body (4xx or 5xx);
                                           `Retry-After: 1` when retry_after is given (a
                                           string is sent as it is: "inf", an HTTP date)
    {"reset": "before"}                    reset the TCP connection (RST) before any header
    {"reset": "during", "after_chunks": 3} send the headers and 3 chunks, then reset
    {"stall": 5}                           read the request, send nothing for 5 s, go on
    {"stall": 5, "after_chunks": 3}        the same after the headers and 3 chunks
    {"slow": 0.2}                          0.2 s before each chunk (combines with reset/stall)
    {"down": true}                         503 on every route, /health and /v1/models too
    {"words": ["a", "b"]}                  the answer is these words, as they are, one a chunk
    {"chunks": 1024, "chunk_bytes": 65536} a 1,024-word answer, each word padded with x to
                                           64 KiB (combines with the others)
    {"reasoning": ["Two", " and two."]}    a chat answer thinks first, as vLLM's server with a
                                           reasoning parser writes it: a `{"reasoning": ...}`
                                           delta per thought before the content, the
                                           unstreamed `message.reasoning`, and the usage's
                                           `completion_tokens_details.reasoning_tokens` (a
                                           thought a token, counted in `completion_tokens`;
                                           `max_tokens` cuts the words only). The request's
                                           `include_reasoning` is ignored, as a server without
                                           the field would (combines with the others)
    {"reset_all": true}                    back to normal
    {"reset_stats": true}                  counters back to zero (live gauges stay)

Add `"times": N` to apply a behaviour to the next N requests it concerns, then go back to
normal; without it, it lasts until the next control request. `status`, `reset`, `stall`
and `slow` concern the two completion routes only; `down` concerns every route but
`/_control` and `/_stats`; `words`, `chunks` and `chunk_bytes` shape the completions' answer
(a word counts as one token), `reasoning` the chat answer's thoughts. `GET /_control` shows
the behaviour in force. Bad control bodies get a 400 saying why.

Counters, `GET /_stats` (timestamps are `time.monotonic()` of this process: CLOCK_MONOTONIC,
the same clock as a test's `time.monotonic()` on the same Linux host):

    {"requests": {"/v1/chat/completions": 3, ...},  received, per path (control excluded)
     "in_flight": 1,               requests being answered now
     "completed": 2,               responses sent in full (any status)
     "statuses": {"200": 1, "503": 1},   of the completed responses
     "models": {"fault-model": 3},  the `model` completion requests named (whatever this
                                    server's own is)
     "priorities": {"None": 3},    the `priority` completion requests carried (None: none)
     "bodies": [{...}, ...],       the last 32 completion request bodies, as sent
     "sent_bytes": 4096,           body bytes of streamed completions the server took (its
                                   sends wait while the client's socket is full)
     "resets": 0,                  connections this server reset on purpose
     "disconnects": [12345.678],   when it noticed a client leave before its response ended
     "open_connections": 4,        TCP connections open now (keep-alive ones included)
     "connections_accepted": 9,    TCP connections accepted (a pool that reuses them: few)
     "arrivals": [{"path": ..., "at": 12345.6, "fault": "status"}, ...],  the last 1,000
     "now": 12346.0, "pid": 4242}  this process's id
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, MutableMapping
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, cast

import httpx

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
CONTROL_PATHS = ("/_control", "/_stats")
WORDS = [
    "Water", "finds", "the", "open", "sluice", "and", "the", "gate", "holds", "back", "what",
    "the", "channel", "cannot", "take,", "so", "the", "river", "keeps", "its", "pace", "while",
    "the", "fields", "below", "stay", "green", "through", "the", "summer",
]  # fmt: skip
ARRIVALS_KEPT = 1000
BODIES_KEPT = 32
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
DONE = b"data: [DONE]\n\n"
RST_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST
TOY_TOKEN = re.compile(r"<\|\w+\|>|\w{1,4}|[^\w\s]|\s+")
TOY_VOCAB = 50_000
BOS = 1


def toy_tokens(text: str, add_special_tokens: bool = False) -> list[str]:
    """The toy tokenizer of `--tokenize` (see the module docstring)."""
    return (["<s>"] if add_special_tokens else []) + TOY_TOKEN.findall(text)


def toy_ids(tokens: list[str]) -> list[int]:
    return [BOS if t == "<s>" else 2 + zlib.crc32(t.encode()) % TOY_VOCAB for t in tokens]


def toy_chat(messages: list[Any], add_generation_prompt: bool = True) -> str:
    """The toy chat template: each message between markers, then the assistant's."""
    text = "".join(
        f"<|{m.get('role')}|>\n{m.get('content') or ''}<|end|>\n"
        for m in messages
        if isinstance(m, dict)
    )
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


class ControlError(ValueError):
    """A control body that cannot be a behaviour."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the next requests get; all None/False is a healthy server."""

    status: int | None = None
    retry_after: float | str | None = None
    reset: str | None = None
    stall: float | None = None
    after_chunks: int | None = None
    slow: float | None = None
    down: bool = False
    words: tuple[str, ...] | None = None
    chunks: int | None = None
    chunk_bytes: int | None = None
    reasoning: tuple[str, ...] | None = None
    times: int | None = None

    @property
    def normal(self) -> bool:
        return self == Behaviour()

    @property
    def shaped(self) -> bool:
        """Whether it changes the answer (`words`, `chunks`, `chunk_bytes`, `reasoning`)."""
        return (self.words, self.chunks, self.chunk_bytes, self.reasoning) != (None,) * 4

    @property
    def fault(self) -> str | None:
        """The name the arrivals log gives this behaviour's fault."""
        for name in ("down", "status", "reset", "stall", "slow"):
            if getattr(self, name):
                return name
        return "answer" if self.shaped else None


def parse_control(body: object) -> Behaviour | None:
    """The behaviour a control body asks for; None for `reset_stats` alone."""
    if not isinstance(body, dict):
        raise ControlError("the control body must be a JSON object")
    known = {*Behaviour.__dataclass_fields__, "reset_all", "reset_stats"}
    if unknown := sorted(set(body) - known):
        raise ControlError(f"unknown control fields: {', '.join(unknown)}")
    if body.get("reset_all"):
        if set(body) - {"reset_all", "reset_stats"}:
            raise ControlError("reset_all takes no other fields")
        return Behaviour()
    rest = {k: v for k, v in body.items() if k != "reset_stats"}
    if not rest:
        return None
    behaviour = Behaviour(
        status=_number(rest, "status", int, 400, 599),
        retry_after=_retry_after(rest),
        reset=rest.get("reset"),
        stall=_number(rest, "stall", float, 0, 3600),
        after_chunks=_number(rest, "after_chunks", int, 0, 1_000_000),
        slow=_number(rest, "slow", float, 0, 60),
        down=_flag(rest, "down"),
        words=_words(rest),
        reasoning=_words(rest, "reasoning"),
        chunks=_number(rest, "chunks", int, 1, 100_000),
        chunk_bytes=_number(rest, "chunk_bytes", int, 1, 1 << 20),
        times=_number(rest, "times", int, 1, 1_000_000),
    )
    if behaviour.reset not in (None, "before", "during"):
        raise ControlError('reset must be "before" or "during"')
    exclusive = [n for n in ("status", "reset", "stall", "down") if getattr(behaviour, n)]
    if len(exclusive) > 1:
        raise ControlError(f"choose one of status, reset, stall, down (got {exclusive})")
    if behaviour.retry_after is not None and behaviour.status is None:
        raise ControlError("retry_after goes with status")
    if behaviour.reset == "during" and behaviour.after_chunks is None:
        raise ControlError('reset "during" needs after_chunks')
    if behaviour.after_chunks is not None and not (behaviour.reset == "during" or behaviour.stall):
        raise ControlError('after_chunks goes with reset "during" or stall')
    if behaviour.normal or (behaviour.times is not None and behaviour.fault is None):
        raise ControlError("no behaviour given (use reset_all to go back to normal)")
    return behaviour


def _number(body: dict[str, Any], name: str, kind: type, low: float, high: float) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ControlError(f"{name} must be a number from {low} to {high}")
    if kind is int and value != int(value):
        raise ControlError(f"{name} must be a whole number")
    return kind(value)


def _retry_after(body: dict[str, Any]) -> float | str | None:
    """A number of seconds (up to 10^12, to try absurd waits), or a header value as it is."""
    value = body.get("retry_after")
    if isinstance(value, str):
        if not value or not value.isprintable():
            raise ControlError("retry_after must be a printable header value")
        return value
    return cast(float | None, _number(body, "retry_after", float, 0, 1e12))


def _words(body: dict[str, Any], name: str = "words") -> tuple[str, ...] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(w, str) for w in value):
        raise ControlError(f"{name} must be a non-empty list of strings")
    return tuple(value)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ControlError(f"{name} must be true or false")
    return value


@dataclass(slots=True)
class Stats:
    """The counters `GET /_stats` shows (see the module docstring)."""

    requests: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    completed: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)
    priorities: Counter[str] = field(default_factory=Counter)
    bodies: deque[Any] = field(default_factory=lambda: deque(maxlen=BODIES_KEPT))
    sent_bytes: int = 0
    resets: int = 0
    disconnects: list[float] = field(default_factory=list)
    arrivals: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))

    def clear(self) -> None:
        """Counters back to zero; `in_flight` is a live gauge and stays."""
        self.requests, self.statuses, self.models = Counter(), Counter(), Counter()
        self.priorities = Counter()
        self.bodies = deque(maxlen=BODIES_KEPT)
        self.completed = self.resets = self.sent_bytes = 0
        self.disconnects = []
        self.arrivals = deque(maxlen=ARRIVALS_KEPT)


class Connections:
    """The open TCP connections, by peer address, so a request can reset its own."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], asyncio.BaseTransport] = {}
        self.accepted = 0

    def protocol(self, base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        """`base` (uvicorn's HTTP protocol) keeping this registry up to date."""
        connections = self
        registry = self.open

        class Tracked(base):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self._peer = _peer(transport)
                registry[self._peer] = transport
                connections.accepted += 1
                super().connection_made(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                registry.pop(self._peer, None)
                super().connection_lost(exc)

        return Tracked

    def reset(self, client: tuple[str, int]) -> None:
        """Close the connection of `client` with a RST, dropping whatever is unsent."""
        transport = self.open.get(client)
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST_ON_CLOSE)
        cast(asyncio.Transport, transport).abort()  # uvloop's transports are not subclasses


def _peer(transport: asyncio.BaseTransport) -> tuple[str, int]:
    peer = transport.get_extra_info("peername")
    return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple | list) else ("", 0)


class Script:
    """The canned answer's bytes, built once per length: each event after its `id`."""

    def __init__(
        self,
        model: str,
        chunks: int,
        words: tuple[str, ...] | None = None,
        pad: int | None = None,
        created: int | None = None,
        thoughts: tuple[str, ...] | None = None,
    ) -> None:
        self.model = model
        self.chunks = chunks
        self.thoughts = thoughts or ()
        """A chat answer's thoughts, each a chunk before the words (`reasoning` control)."""
        self.given = words
        """The answer's words as they are (`words` control); None: the canned ones."""
        self.pad = pad
        self.created = int(time.time()) if created is None else created
        self._events: dict[tuple[bool, int, bool], list[bytes]] = {}

    def words(self, n: int) -> list[str]:
        if self.given is not None:
            words = [self.given[i % len(self.given)] for i in range(n)]
        else:
            words = [("" if i == 0 else " ") + WORDS[i % len(WORDS)] for i in range(n)]
        return [w.ljust(self.pad, "x") for w in words] if self.pad else words

    def finish_reason(self, n: int) -> str:
        return "length" if n < self.chunks else "stop"

    def events(self, chat: bool, n: int, usage: bool = False) -> list[bytes]:
        """The streamed events of an `n`-word answer, each to follow `data: {"id":"<id>"`,
        as OpenAI writes them (compact; each chunk with `"usage":null` when the usage was
        asked for)."""
        key = (chat, n, usage)
        if key not in self._events:
            choices: list[dict[str, Any]]
            if chat:
                choices = [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                choices += [
                    {"delta": {"reasoning": t}, "finish_reason": None} for t in self.thoughts
                ]
                choices += [{"delta": {"content": w}, "finish_reason": None} for w in self.words(n)]
                choices.append({"delta": {}, "finish_reason": self.finish_reason(n)})
            else:
                choices = [{"text": w, "finish_reason": None} for w in self.words(n)]
                choices.append({"text": "", "finish_reason": self.finish_reason(n)})
            self._events[key] = [
                self._tail(chat, {"index": 0, **c, "logprobs": None}, None if usage else ())
                for c in choices
            ]
        return self._events[key]

    def usage(self, chat: bool, prompt_tokens: int, n: int) -> dict[str, Any]:
        """The usage of an `n`-word answer: its thoughts counted as vLLM's server counts
        them (in `completion_tokens`, and in `completion_tokens_details`)."""
        thought = len(self.thoughts) if chat else 0
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n + thought,
            "total_tokens": prompt_tokens + n + thought,
        }
        if thought:
            usage["completion_tokens_details"] = {"reasoning_tokens": thought}
        return usage

    def usage_event(self, chat: bool, usage: dict[str, Any]) -> bytes:
        return self._tail(chat, None, usage)

    def _tail(self, chat: bool, choice: dict[str, Any] | None, usage: Any = ()) -> bytes:
        """An event after its id; `usage` () leaves the field out."""
        if choice is not None:  # OpenAI's order: the finish reason last
            choice = {k: v for k, v in choice.items() if k != "finish_reason"} | {
                "finish_reason": choice.get("finish_reason")
            }
        event: dict[str, Any] = {
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice] if choice else [],
        }
        if usage != ():
            event["usage"] = usage
        return b'",' + json.dumps(event, separators=(",", ":")).encode()[1:] + b"\n\n"

    def body(self, chat: bool, request_id: str, n: int, usage: dict[str, Any]) -> bytes:
        text = "".join(self.words(n))
        choice: dict[str, Any] = (
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        if chat and self.thoughts:
            choice["message"]["reasoning"] = "".join(self.thoughts)
        return json.dumps(
            {
                "id": request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, **choice, "logprobs": None, "finish_reason": self.finish_reason(n)}
                ],
                "usage": usage,
            }
        ).encode()


@dataclass(slots=True)
class Exchange:
    """One request being answered: what the guard needs to tell a client leaving from us."""

    client: tuple[str, int]
    finished: bool = False
    reset: bool = False
    counted: bool = True  # in the stats' completed and statuses (control requests are not)


class FaultUpstream:
    """The ASGI app."""

    def __init__(
        self,
        model: str,
        chunks: int,
        delay: float,
        api_key: str | None,
        tokenize: bool = False,
        max_model_len: int = 2048,
    ) -> None:
        self.script = Script(model, chunks)
        self.delay = delay
        self.api_key = api_key
        self.tokenize = tokenize
        self.max_model_len = max_model_len
        self.behaviour = Behaviour()
        self.stats = Stats()
        self.connections = Connections()
        self._ids = count(1)
        self._shaped: dict[tuple[object, ...], Script] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in CONTROL_PATHS:
            await self._control(path, method, receive, send)
            return
        self.stats.requests[path] += 1
        self.stats.in_flight += 1
        try:
            await self._serve(scope, path, method, receive, send)
        finally:
            self.stats.in_flight -= 1

    async def _serve(
        self, scope: Scope, path: str, method: str, receive: Receive, send: Send
    ) -> None:
        host, port = scope.get("client") or ("", 0)
        exchange = Exchange((host, port))
        behaviour = self._take(path)
        self.stats.arrivals.append({"path": path, "at": time.monotonic(), "fault": behaviour.fault})
        body = await _read_body(receive)
        if body is None:
            self.stats.disconnects.append(time.monotonic())
            return
        if behaviour.down:
            await self._error(send, exchange, 503, "the upstream is down", "server_error")
        elif path == "/health" and method == "GET":
            await self._respond(send, exchange, 200, b"", [])
        elif path.startswith("/v1/") and not self._authorized(scope):
            await self._error(send, exchange, 401, "invalid API key", "invalid_request_error")
        elif path == "/v1/models" and method == "GET":
            await self._respond(send, exchange, 200, self._models(), JSON_HEADERS)
        elif path == "/tokenize" and method == "POST" and self.tokenize:
            await self._tokenize(send, exchange, body)
        elif path in COMPLETION_PATHS and method == "POST":
            await self._guard(
                receive, exchange, self._complete(path, body, behaviour, exchange, send)
            )
        elif path in COMPLETION_PATHS or path in ("/health", "/v1/models"):
            await self._error(send, exchange, 405, "method not allowed", "invalid_request_error")
        else:
            await self._error(send, exchange, 404, f"no route {path}", "invalid_request_error")

    def _take(self, path: str) -> Behaviour:
        """The behaviour for this request, counting it against `times`."""
        behaviour = self.behaviour
        if behaviour.normal or (path not in COMPLETION_PATHS and not behaviour.down):
            return Behaviour()
        if behaviour.times is not None:
            left = behaviour.times - 1
            self.behaviour = (
                Behaviour(**{**asdict(behaviour), "times": left}) if left else Behaviour()
            )
        return behaviour

    def _authorized(self, scope: Scope) -> bool:
        if self.api_key is None:
            return True
        expected = f"Bearer {self.api_key}".encode()
        return any(k == b"authorization" and v == expected for k, v in scope["headers"])

    def _models(self) -> bytes:
        model = {
            "id": self.script.model,
            "object": "model",
            "created": self.script.created,
            "owned_by": "fault-upstream",
            "max_model_len": self.max_model_len,
        }
        return json.dumps({"object": "list", "data": [model]}).encode()

    async def _tokenize(self, send: Send, exchange: Exchange, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            if "messages" in body:
                text = toy_chat(body["messages"], body.get("add_generation_prompt", True))
                tokens = toy_tokens(text, add_special_tokens=True)
            else:
                tokens = toy_tokens(str(body["prompt"]), body.get("add_special_tokens", True))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            await self._error(send, exchange, 400, f"bad /tokenize body: {exc}", "BadRequest")
            return
        answer = {
            "count": len(tokens),
            "max_model_len": self.max_model_len,
            "tokens": toy_ids(tokens),
            "token_strs": tokens if body.get("return_token_strs") else None,
        }
        await self._respond(send, exchange, 200, json.dumps(answer).encode(), JSON_HEADERS)

    def _toy_count(self, raw: bytes, chat: bool) -> int:
        body = json.loads(raw)
        if chat:
            return len(toy_tokens(toy_chat(body["messages"]), add_special_tokens=True))
        return len(toy_tokens(str(body["prompt"]), add_special_tokens=True))

    async def _guard(
        self, receive: Receive, exchange: Exchange, work: Coroutine[Any, Any, None]
    ) -> None:
        """Run `work` until it ends or the client leaves (then it is cancelled, as a real
        server aborts the generation)."""
        answer = asyncio.ensure_future(work)
        left = asyncio.ensure_future(_disconnected(receive))
        await asyncio.wait((answer, left), return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            left.cancel()
            answer.result()
            return
        answer.cancel()
        if not (exchange.finished or exchange.reset):
            self.stats.disconnects.append(left.result())
        await asyncio.gather(answer, return_exceptions=True)

    async def _complete(
        self, path: str, raw: bytes, behaviour: Behaviour, exchange: Exchange, send: Send
    ) -> None:
        chat = path == "/v1/chat/completions"
        try:
            request = _completion_request(raw, chat)
        except ValueError as exc:
            await self._error(send, exchange, 400, str(exc), "invalid_request_error")
            return
        if request["model"] is not None:
            self.stats.models[request["model"]] += 1
        self.stats.priorities[str(request["priority"])] += 1
        self.stats.bodies.append(json.loads(raw))
        script = self._script(behaviour)
        if self.tokenize:
            request["prompt_tokens"] = self._toy_count(raw, chat)
            wanted = request["prompt_tokens"] + (request["max_tokens"] or 1)
            if wanted > self.max_model_len:
                message = (
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, your request has {request['prompt_tokens']} input tokens."
                )
                await self._error(send, exchange, 400, message, "BadRequestError")
                return
        if behaviour.status is not None:
            headers = []
            if behaviour.retry_after is not None:
                headers.append((b"retry-after", _seconds(behaviour.retry_after)))
            kind = (
                "rate_limit_error"
                if behaviour.status == 429
                else ("server_error" if behaviour.status >= 500 else "invalid_request_error")
            )
            await self._error(
                send, exchange, behaviour.status, f"injected {behaviour.status}", kind, headers
            )
            return
        if behaviour.reset == "before":
            await self._reset(exchange)
        if behaviour.stall and behaviour.after_chunks is None:
            await asyncio.sleep(behaviour.stall)
        n = min(script.chunks, request["max_tokens"] or script.chunks)
        usage = script.usage(chat, request["prompt_tokens"], n)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-fault-{next(self._ids)}"
        pace = behaviour.slow if behaviour.slow is not None else self.delay
        if request["stream"]:
            await self._stream(
                send,
                exchange,
                script,
                chat,
                request_id,
                n,
                usage if request["usage"] else None,
                behaviour,
                pace,
            )
        else:
            await self._whole(
                send, exchange, script.body(chat, request_id, n, usage), behaviour, pace * n
            )

    def _script(self, behaviour: Behaviour) -> Script:
        """The answer's script: the canned one, or one shaped by the behaviour (kept)."""
        if not behaviour.shaped:
            return self.script
        key = (behaviour.words, behaviour.chunks, behaviour.chunk_bytes, behaviour.reasoning)
        if key not in self._shaped:
            words = behaviour.words
            chunks = behaviour.chunks or (len(words) if words else self.script.chunks)
            self._shaped[key] = Script(
                self.script.model,
                chunks,
                words,
                behaviour.chunk_bytes,
                self.script.created,
                behaviour.reasoning,
            )
        return self._shaped[key]

    async def _stream(
        self,
        send: Send,
        exchange: Exchange,
        script: Script,
        chat: bool,
        request_id: str,
        n: int,
        usage: dict[str, Any] | None,
        behaviour: Behaviour,
        pace: float,
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        head = b'data: {"id":"' + request_id.encode()
        events = script.events(chat, n, usage is not None)
        if usage is not None:
            events = [*events, script.usage_event(chat, usage)]
        for index, tail in enumerate(events):
            if index == behaviour.after_chunks:
                await self._mid_stream_fault(behaviour, exchange)
            if pace:
                await asyncio.sleep(pace)
            await send({"type": "http.response.body", "body": head + tail, "more_body": True})
            self.stats.sent_bytes += len(head) + len(tail)
        if behaviour.after_chunks is not None and behaviour.after_chunks >= len(events):
            await self._mid_stream_fault(behaviour, exchange)
        exchange.finished = True
        await send({"type": "http.response.body", "body": DONE, "more_body": False})
        self._count(exchange, 200)

    async def _whole(
        self, send: Send, exchange: Exchange, body: bytes, behaviour: Behaviour, wait: float
    ) -> None:
        if wait:
            await asyncio.sleep(wait)
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if behaviour.after_chunks is not None:
            # Not streamed, a "chunk" is half the body: the fault comes mid-body.
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            await self._mid_stream_fault(behaviour, exchange)
            body = body[len(body) // 2 :]
        exchange.finished = True
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self._count(exchange, 200)

    async def _mid_stream_fault(self, behaviour: Behaviour, exchange: Exchange) -> None:
        if behaviour.reset == "during":
            await self._reset(exchange)
        elif behaviour.stall:
            await asyncio.sleep(behaviour.stall)

    async def _reset(self, exchange: Exchange) -> None:
        """Reset the connection, then wait to be cancelled when the server sees it gone."""
        exchange.reset = True
        self.stats.resets += 1
        self.connections.reset(exchange.client)
        await asyncio.Event().wait()

    async def _respond(
        self,
        send: Send,
        exchange: Exchange,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        exchange.finished = True
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self._count(exchange, status)

    async def _error(
        self,
        send: Send,
        exchange: Exchange,
        status: int,
        message: str,
        kind: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        await self._respond(
            send, exchange, status, json.dumps(body).encode(), [*JSON_HEADERS, *(headers or [])]
        )

    def _count(self, exchange: Exchange, status: int) -> None:
        if not exchange.counted:
            return
        self.stats.completed += 1
        self.stats.statuses[str(status)] += 1

    async def _control(self, path: str, method: str, receive: Receive, send: Send) -> None:
        raw = await _read_body(receive)
        exchange = Exchange(("", 0), counted=False)
        if path == "/_stats" and method == "GET":
            await self._respond(
                send, exchange, 200, json.dumps(self._stats()).encode(), JSON_HEADERS
            )
            return
        if path == "/_control" and method == "POST":
            try:
                body = json.loads(raw or b"null")
                behaviour = parse_control(body)
            except ValueError as exc:
                await self._error(send, exchange, 400, str(exc), "invalid_request_error")
                return
            if body.get("reset_stats"):
                self.stats.clear()
                self.connections.accepted = 0
            if behaviour is not None:
                self.behaviour = behaviour
        elif not (path == "/_control" and method == "GET"):
            await self._error(send, exchange, 405, "method not allowed", "invalid_request_error")
            return
        current = {k: v for k, v in asdict(self.behaviour).items() if v not in (None, False)}
        await self._respond(send, exchange, 200, json.dumps(current).encode(), JSON_HEADERS)

    def _stats(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "requests": dict(stats.requests),
            "in_flight": stats.in_flight,
            "completed": stats.completed,
            "statuses": dict(stats.statuses),
            "models": dict(stats.models),
            "priorities": dict(stats.priorities),
            "bodies": list(stats.bodies),
            "sent_bytes": stats.sent_bytes,
            "resets": stats.resets,
            "disconnects": stats.disconnects,
            "open_connections": len(self.connections.open),
            "connections_accepted": self.connections.accepted,
            "arrivals": list(stats.arrivals),
            "now": time.monotonic(),
            "pid": os.getpid(),
        }


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None when the client left before sending it all."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _disconnected(receive: Receive) -> float:
    """When the client went away (the body is read: the next message can only say so)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    return time.monotonic()


def _completion_request(raw: bytes, chat: bool) -> dict[str, Any]:
    """What the answer depends on (stream, usage, max tokens and a prompt-length estimate),
    and the model it names."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        prompt = " ".join(
            str(m.get("content", "")) if isinstance(m, dict) else "" for m in messages
        )
    else:
        if "prompt" not in body:
            raise ValueError("prompt is required")
        prompt = str(body["prompt"])
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError("max_tokens must be a positive integer")
    options = body.get("stream_options") or {}
    model = body.get("model")
    return {
        "model": None if model is None else str(model),
        "stream": bool(body.get("stream")),
        "usage": bool(isinstance(options, dict) and options.get("include_usage")),
        "max_tokens": max_tokens,
        "prompt_tokens": max(1, len(prompt.split())),
        "priority": body.get("priority"),
    }


def _seconds(value: float | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return str(int(value) if value == int(value) else value).encode()


@dataclass
class FaultUpstreamProcess:
    """A running `python -m tests.support.fault_upstream`, for tests and benchmarks to drive."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        """The base URL a gateway is given (ends in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def control(self, **behaviour: Any) -> dict[str, Any]:
        response = httpx.post(f"{self.root}/_control", json=behaviour, timeout=5)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def stats(self) -> dict[str, Any]:
        response = httpx.get(f"{self.root}/_stats", timeout=5)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def arrivals(self) -> list[float]:
        """When chat requests arrived (health probes left out)."""
        return [a["at"] for a in self.stats()["arrivals"] if a["path"] == "/v1/chat/completions"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start(
    port: int, *flags: str, log: Path | None = None, timeout_s: float = 20.0
) -> FaultUpstreamProcess:
    """Start the double and wait until it answers (itself: another server already on the port
    would answer too, so the pid in /_stats must be the new process's). On `port` 0 this
    process binds a loopback port the kernel picks and hands the listening socket over to the
    double, so no one can take the port in between."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    held: socket.socket | None = None
    where = ["--port", str(port)]
    if port == 0:
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen(4096)
        port = int(held.getsockname()[1])
        where = ["--port", str(port), "--fd", str(held.fileno())]
    out = log.open("wb") if log else subprocess.DEVNULL
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fault_upstream", *where, *flags],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
            pass_fds=(held.fileno(),) if held else (),
        )  # fmt: skip
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
        if held:
            held.close()  # the double holds it now
    upstream = FaultUpstreamProcess(process, port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the fault upstream exited with {process.returncode}")
        try:
            if upstream.stats()["pid"] == process.pid:
                return upstream
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    upstream.stop()
    raise RuntimeError(f"the fault upstream did not answer in {timeout_s} s")


def main() -> None:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fd", type=int, help="listen on this inherited socket (on --port)")
    parser.add_argument("--chunks", type=int, default=32, help="words in an answer")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each chunk")
    parser.add_argument("--model", default="fault-model", help="the id /v1/models lists")
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/*")
    parser.add_argument("--tokenize", action="store_true", help="answer /tokenize (toy counts)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="the context window")
    args = parser.parse_args()
    app = FaultUpstream(
        args.model, args.chunks, args.delay, args.api_key, args.tokenize, args.max_model_len
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, loop="uvloop", lifespan="off", access_log=False,
        log_level="warning", http=app.connections.protocol(HttpToolsProtocol), backlog=4096,
        timeout_keep_alive=30,
    )  # fmt: skip
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()


@contextlib.contextmanager
def running(log: Path, *flags: str, **control: Any) -> Iterator[FaultUpstreamProcess]:
    """`start` on a port of its own, logging to `log`, with `control` set (`reasoning`,
    `words`, ...), stopped when the block ends however it ends."""
    process = start(0, *flags, log=log)
    try:
        if control:
            process.control(**control)
        yield process
    finally:
        process.stop()
