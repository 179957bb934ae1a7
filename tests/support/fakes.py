"""A fake engine for unit tests of gateway logic. It is not vLLM and does not pretend to be:
it tokenizes by whitespace and replays scripted deltas."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider

from sluicegate.app import create_app
from sluicegate.engine.protocol import (
    ChatEncoding,
    ChatMessages,
    ChoiceDelta,
    Embedding,
    EngineLoad,
    EngineStep,
    EngineTimes,
    Prompt,
    PromptImage,
    ReasoningParser,
    SamplingOptions,
    StructuredOutput,
    TemplateKwargs,
    Tokenized,
    TokenLogprob,
    ToolCallParser,
    Tools,
)
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.errors import (
    EngineUnavailableError,
    GatewayError,
    InvalidRequestError,
    MediaError,
)
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig
from sluicegate.lifecycle import Lifecycle
from sluicegate.server import GIL_SWITCH_INTERVAL
from sluicegate.settings import Settings
from sluicegate.wire.completion import Collector, Completion
from tests.support.clock import Clock
from tests.support.redis_server import shared_redis_url


class WhitespaceTokenizer:
    vocab_size = 1000

    def __init__(self) -> None:
        self.template_kwargs: list[TemplateKwargs | None] = []
        """What each chat encoding was given as `template_kwargs`, in order."""

    async def encode_chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        self.template_kwargs.append(template_kwargs)
        return [len(w) for m in messages for w in (m["role"] + " " + m["content"]).split()]

    async def encode_chat_counted(
        self,
        messages: ChatMessages,
        ids_up_to: int | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        return ChatEncoding(
            await self.encode_chat(messages, tools, template_kwargs),
            tuple(len((m["role"] + " " + m["content"]).split()) for m in messages),
            tuple(len(m["content"].split()) for m in messages),
        )

    async def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    async def count(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    async def tokenize(
        self, text: str, add_special_tokens: bool = True, with_strings: bool = False
    ) -> Tokenized:
        words = text.split()
        return Tokenized([len(w) for w in words], words if with_strings else None)

    async def render_chat(
        self,
        messages: Sequence[dict[str, str]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> str:
        return " ".join(m["role"] + " " + m["content"] for m in messages)

    async def decode(self, token_ids: Sequence[int]) -> str:
        """Each id as a word of that many letters (what `encode` counted)."""
        return " ".join("x" * i for i in token_ids)


@dataclass
class FakeEngine:
    """Yields `words` one per step for each choice; can fail before or after output starts."""

    words: list[str] = field(default_factory=lambda: ["Hello", " there", "!"])
    reasoning_words: list[str] = field(default_factory=list)
    """Thoughts, yielded one per step before `words`, split already (as an upstream that
    splits them); the last delta counts them as `reasoning_tokens`."""
    max_model_len: int = 64
    fail_before_output: GatewayError | None = None
    fail_after_words: int | None = None
    step_delay: float = 0.0
    delays: list[float] | None = None
    """Per-word delays; overrides `step_delay` where given."""
    healthy: bool = True
    requests: list[tuple[str, list[int], SamplingOptions]] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)
    """Each request's prompt as the engine got it."""
    arrivals: list[float] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    asked_adapters: list[str | None] = field(default_factory=list)
    """Each request's `adapter`."""
    active: set[str] = field(default_factory=set)
    tokenizer: WhitespaceTokenizer = field(default_factory=WhitespaceTokenizer)
    refused_constraint: str | None = None
    checked: list[StructuredOutput] = field(default_factory=list)
    tool_parser: ToolCallParser | None = None
    reasoning_parser: ReasoningParser | None = None
    renders_chat: bool = False
    engine_load: EngineLoad | None = None
    """What `load()` reports (a test sets it); None: not known, as for an upstream."""
    takes_images: bool = False
    tokens_per_image: int = 16
    """What each image adds to a prompt (`image_tokens`), exactly unless
    `estimates_images`."""
    estimates_images: bool = False
    refused_image: int | None = None
    """The position of an image `image_tokens` refuses, as vLLM's processor may."""
    counted_prompt_tokens: int | None = None
    """The prompt tokens the steps report (by default the prompt's own length)."""

    async def image_tokens(self, images: Sequence[PromptImage]) -> tuple[list[int], bool]:
        if self.refused_image is not None and self.refused_image < len(images):
            refused = MediaError("model_refused", "the model cannot read it: too wide")
            refused.index = self.refused_image
            raise refused
        return [self.tokens_per_image] * len(images), not self.estimates_images

    async def generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncIterator[EngineStep]:
        self.requests.append((request_id, prompt.ids, options))
        self.prompts.append(prompt)
        self.arrivals.append(arrival_time)
        self.priorities.append(priority)
        self.asked_adapters.append(adapter)
        if self.fail_before_output is not None:
            raise self.fail_before_output
        self.active.add(request_id)
        taken = time.perf_counter()  # reported as vLLM's engine reports its own times
        try:
            words = self.words[: options.max_tokens]
            # A word that is a stop string ends the choice before it, as vLLM does (without
            # the string), and is reported as the stop sequence that matched.
            stopped = next((i for i, w in enumerate(words) if w.strip() in options.stop), None)
            stop_sequence = None if stopped is None else words[stopped].strip()
            if stopped is not None:
                words = words[:stopped] or [""]
            for thought in self.reasoning_words:
                await asyncio.sleep(self.step_delay)
                yield EngineStep(
                    choices=[
                        ChoiceDelta(index=i, text="", num_tokens=1, reasoning=thought)
                        for i in range(options.n)
                    ],
                    prompt_tokens=self.counted_prompt_tokens or prompt.length,
                )
            for position, word in enumerate(words):
                if self.fail_after_words is not None and position == self.fail_after_words:
                    raise EngineUnavailableError()
                delays = self.delays or []
                await asyncio.sleep(delays[position] if position < len(delays) else self.step_delay)
                last = position == len(words) - 1
                reason = None
                if last:
                    cut = stopped is None and len(words) == options.max_tokens
                    reason = "length" if cut else "stop"
                yield EngineStep(
                    choices=[
                        ChoiceDelta(
                            index=i,
                            text=word,
                            num_tokens=1,
                            finish_reason=reason,
                            logprobs=None
                            if options.logprobs is None
                            else [TokenLogprob(word, -0.5, (("alt", -1.5),) * options.logprobs)],
                            stop_sequence=stop_sequence if last else None,
                            reasoning_tokens=len(self.reasoning_words) if last else 0,
                        )
                        for i in range(options.n)
                    ],
                    prompt_tokens=self.counted_prompt_tokens or prompt.length,
                    finished=last,
                    prompt_logprobs=_prompt_logprobs(prompt.ids, options)
                    if position == 0
                    else None,
                    times=EngineTimes(taken, taken, time.perf_counter()) if position == 0 else None,
                )
        finally:
            self.active.discard(request_id)

    async def check_structured(self, structured: StructuredOutput) -> None:
        """Refuses a regex or grammar containing `refused_constraint` (a stand-in for the
        engine's grammar parser)."""
        self.checked.append(structured)
        text = structured.regex or structured.grammar or structured.json or ""
        if self.refused_constraint and self.refused_constraint in text:
            raise InvalidRequestError(f"the engine refuses {self.refused_constraint!r}")

    def load(self) -> EngineLoad | None:
        return self.engine_load

    async def check_health(self) -> None:
        if not self.healthy:
            raise EngineUnavailableError()

    async def shutdown(self) -> None:
        self.healthy = False


def _prompt_logprobs(
    prompt_token_ids: list[int], options: SamplingOptions
) -> list[TokenLogprob | None] | None:
    """Like vLLM's: None for the first token; each other id `i` is the word of `i` x's."""
    k = options.prompt_logprobs
    if k is None:
        return None
    rest = [TokenLogprob(" " + "x" * i, -float(i), (("alt", -9.0),) * k) for i in prompt_token_ids]
    return [None, *rest[1:]]


FAKE_MODEL = "fake-model"
FAKE_EMBEDDER = "fake-embed"


@dataclass
class FakeEmbedder:
    """Embeds each prompt as a deterministic unit vector of `size` made from its token ids;
    records every call's prompts, so a test sees what was computed."""

    size: int = 8
    max_model_len: int = 64
    delay: float = 0.0
    tokenizer: WhitespaceTokenizer = field(default_factory=WhitespaceTokenizer)
    calls: list[list[Prompt]] = field(default_factory=list)
    matryoshka: bool = False
    healthy: bool = True
    cancelled: int = 0
    """Calls cancelled while they waited their `delay` (the request was aborted)."""

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        self.calls.append(list(prompts))
        if self.delay:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return [Embedding(self.vector(p.ids, dimensions), len(p.ids)) for p in prompts]

    def vector(self, ids: Sequence[int], dimensions: int | None = None) -> list[float]:
        raw = [float((sum(ids) + 1) * (k + 3) % 17 + 1) for k in range(self.size)]
        raw = raw[: dimensions or self.size]
        norm = sum(x * x for x in raw) ** 0.5
        return [x / norm for x in raw]

    async def check_dimensions(self, dimensions: int) -> None:
        if not self.matryoshka or dimensions > self.size:
            raise InvalidRequestError(
                f"Model 'fake' does not support dimensions={dimensions}", param="dimensions"
            )

    def load(self) -> EngineLoad | None:
        return None

    async def check_health(self) -> None:
        if not self.healthy:
            raise EngineUnavailableError()

    async def shutdown(self) -> None:
        self.healthy = False


@dataclass
class FakeLoraLLM:
    """Stands in for vLLM's `AsyncLLM` under `engine.vllm_adapters`: records its LoRA calls,
    and refuses every load with `refuse` as vLLM's message when it is set."""

    refuse: str | None = None
    added: list[Any] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    async def add_lora(self, request: Any) -> bool:
        if self.refuse:
            raise Exception(self.refuse)  # as vLLM raises it: a bare Exception
        self.added.append(request)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.removed.append(lora_id)
        return True


def fake_app(
    engine: FakeEngine | None = None,
    lifecycle: Lifecycle | None = None,
    tracer_provider: TracerProvider | None = None,
    pools: dict[str, FakeEngine | FakeEmbedder] | None = None,
    embedder: FakeEmbedder | None = None,
    **settings: object,
) -> FastAPI:
    """The real app over `engine` (a new FakeEngine by default), serving `fake-model`.

    `pools`: fake engines in place of pools of upstreams, by the first upstream URL of their
    entry in the models file (`models_file` in `settings`). `embedder`: a fake in-process
    embedding engine, served as `fake-embed`."""
    engine = engine or FakeEngine()

    async def factory(_: Settings) -> FakeEngine:
        return engine

    async def pool_factory(config: UpstreamConfig) -> FakeEngine | FakeEmbedder:
        return (pools or {})[config.urls[0][0]]

    async def embedder_factory(_: Settings) -> FakeEmbedder:
        assert embedder is not None
        return embedder

    if embedder is not None:
        settings = {
            "embedding_model": "bundled",
            "embedding_served_name": FAKE_EMBEDDER,
            **settings,
        }
    config = Settings(served_model_name=FAKE_MODEL, _env_file=None, **settings)  # type: ignore[call-arg]
    return create_app(
        config,
        engine_factory=factory,
        lifecycle=lifecycle,
        tracer_provider=tracer_provider,
        pool_factory=pool_factory,
        embedder_factory=embedder_factory,
    )


def models_file(folder: Path, text: str) -> Path:
    """A models file (YAML) in `folder`."""
    path = folder / "models.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@contextlib.contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Serve `app` with uvicorn (httptools) on a loopback port of its own; yields its base URL."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="asyncio", http="httptools", log_level="warning"
    )
    with run_in_thread(uvicorn.Server(config), sock):
        yield f"http://127.0.0.1:{port}"


def loopback_socket() -> socket.socket:
    """A socket bound to a loopback port the kernel chose, to hand to the server that listens
    on it: the port is held from here on, where a port number looked up free and bound later
    could be taken meanwhile (by any process's outgoing connection)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def run_in_thread(
    server: uvicorn.Server, sock: socket.socket | None = None
) -> Iterator[threading.Thread]:
    """Run `server` on a thread until the block ends, listening on `sock` if given (see
    `loopback_socket`); yields the thread once it serves."""
    sockets = None if sock is None else [sock]
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield thread
    finally:
        server.should_exit = True
        thread.join(10)
        if sock is not None:
            sock.close()


@contextlib.contextmanager
def health_silence(base_url: str) -> Iterator[list[float]]:
    """Probe `/health` from a thread of its own while the block runs; the list it yields then
    holds the longest time the gateway went without answering (the probe interval included):
    a stall of its event loop shows as one this long. The gateway must be served in this
    process (`serve_in_thread`)."""
    found: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        last, longest = time.monotonic(), 0.0
        with httpx.Client(base_url=base_url, timeout=60) as http:
            while not stop.is_set():
                assert http.get("/health").status_code == 200
                now = time.monotonic()
                longest, last = max(longest, now - last), now
                time.sleep(0.02)
        found.append(max(longest, time.monotonic() - last))

    # As the gateway runs (`server.serve`): worker threads hand the GIL back every 1 ms.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        yield found
    finally:
        stop.set()
        prober.join()
        sys.setswitchinterval(interval)


def chat_body(text: str = "hi there", **extra: Any) -> dict[str, Any]:
    """A chat request to the fake model: one user turn, and `extra` fields."""
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": text}], **extra}


def greedy_chat(text: str = "Say hello", **extra: Any) -> dict[str, Any]:
    """A chat request the response cache may store (temperature 0)."""
    return chat_body(text, **{"temperature": 0, **extra})


# Generous, for the tests that count generations: a busy machine must not make them fail open.
SLOW_OK = 1.0


def redis_cache(prefix: str, **extra: object) -> dict[str, object]:
    """Settings for an app whose cache lives in the test process's Redis, under `prefix`."""
    return {
        "redis_url": shared_redis_url(),
        "redis_key_prefix": prefix,
        "cache_redis_timeout": SLOW_OK,
        **extra,
    }


async def post(http: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    response = await http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def fake_completion(text: str = "Hello there", logprobs: int = 0, choices: int = 1) -> Completion:
    collector = Collector(range(choices))
    for index in range(choices):
        for word in text.split(" "):
            top = tuple((f"{word}{k}", -1.0 - k) for k in range(logprobs))
            lp = [TokenLogprob(word, -0.5, top)] if logprobs else None
            collector.add(ChoiceDelta(index, word + " ", 1, None, lp))
        collector.add(ChoiceDelta(index, "", 0, "stop"))
    return collector.completion(3)


def measured_prefill_queue(
    rate: float, objective: float | None = 2.0
) -> tuple[PrefillQueue, Clock]:
    """A queue that has seen one run of `rate` tokens take a second to its first token."""
    clock = Clock(0.0)
    queue = PrefillQueue(QueueConfig(objective=objective, min_samples=1), clock)
    ticket = queue.enter(int(rate))
    clock.now += 1.0
    ticket.started()
    return queue, clock
