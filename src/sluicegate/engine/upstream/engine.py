"""`UpstreamEngine`: the engine protocol over remote OpenAI-compatible servers.

The class composes the modules that do the work, one concern each: `pool.Pool` (the
upstreams, their health probes, `/ready`), `dispatcher.Dispatcher` (requests out: the pick,
the send, the retries before the first output), `stream` (the answer read into engine
steps, and the try settled however it ends), and `tokenizer.tokenizer_for` (what the token
budget counts with). Here: start-up, the model and its limits, and a request's body.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx

from sluicegate import fast_json
from sluicegate.engine.protocol import (
    Embedding,
    EngineLoad,
    EngineStep,
    Prompt,
    PromptImage,
    PromptTokenizer,
    ReasoningParser,
    SamplingOptions,
    StructuredOutput,
    ToolCallParser,
)
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.discovery import discover
from sluicegate.engine.upstream.dispatcher import Dispatcher
from sluicegate.engine.upstream.pool import Pool
from sluicegate.engine.upstream.reasoning import gateway_reasoning_parser
from sluicegate.engine.upstream.server import Upstream
from sluicegate.engine.upstream.stream import rest
from sluicegate.engine.upstream.tokenizer import tokenizer_for
from sluicegate.engine.upstream.tool_calls import UpstreamToolParser, reads_records
from sluicegate.engine.upstream.wire import StreamReader, request_body, token_count
from sluicegate.errors import BadGatewayError


class UpstreamEngine:
    def __init__(
        self,
        config: UpstreamConfig,
        upstreams: Sequence[Upstream],
        model: str,
        max_model_len: int,
        tokenizer: PromptTokenizer | None = None,
        rng: random.Random | None = None,
        reasoning_parser: ReasoningParser | None = None,
    ) -> None:
        self._config = config
        self._pool = Pool(config, upstreams)
        self._dispatcher = Dispatcher(config, self._pool.upstreams, rng)
        self._tokenizer = tokenizer
        self._parser = UpstreamToolParser()
        self._reasoning_parser = reasoning_parser
        self.model = model
        """The model id the upstreams serve (their `/v1/models`)."""
        self._max_model_len = max_model_len

    @classmethod
    async def start(
        cls,
        config: UpstreamConfig,
        wait: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> UpstreamEngine:
        """Open a pool per upstream, learn the model from the first `/v1/models` that answers
        (within `wait` seconds, by default `config.start_timeout`), find a tokenizer, and start
        the health probes."""
        wait = config.start_timeout if wait is None else wait
        upstreams = [
            Upstream(url, weight, config.pool, config.breaker, config.api_key, transport)
            for url, weight in config.urls
        ]
        try:
            found, card = await discover(upstreams, wait, config.model)
            model = str(card["id"])
            max_model_len = int(card.get("max_model_len") or config.max_model_len)
            tokenizer = await tokenizer_for(config, found, model)
            parser = None
            if config.reasoning_parser is not None:
                parser = await asyncio.to_thread(
                    gateway_reasoning_parser,
                    config.reasoning_parser,
                    tokenizer,
                    config.reasoning_parser_plugin,
                )
        except BaseException:
            for upstream in upstreams:
                await upstream.close()
            raise
        engine = cls(config, upstreams, model, max_model_len, tokenizer, reasoning_parser=parser)
        engine.watch_health()
        return engine

    # ---- the protocol -----------------------------------------------------------------------

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        return self._tokenizer

    @property
    def tool_parser(self) -> ToolCallParser:
        return self._parser

    @property
    def reasoning_parser(self) -> ReasoningParser | None:
        """The gateway's parser when the pool has one (`reasoning_parser:`): the upstreams
        send their thoughts inside the content. None: an upstream splits its output's
        reasoning itself (vLLM's `reasoning`, or `reasoning_content`), and the reader keeps
        the split."""
        return self._reasoning_parser

    @property
    def renders_chat(self) -> bool:
        return True

    @property
    def takes_images(self) -> bool:
        return self._config.images

    async def image_tokens(self, images: Sequence[PromptImage]) -> tuple[list[int], bool]:
        """The configured estimate for each: the upstream's usage counts them."""
        return [self._config.image_tokens] * len(images), False

    def _request(self, model: str, prompt: Prompt, options: SamplingOptions) -> tuple[str, bytes]:
        forward = self._config.forward_urls
        path, body = request_body(model, prompt, options, options.max_tokens_given, forward)
        return path, fast_json.dumps(body)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def upstreams(self) -> list[Upstream]:
        return self._pool.upstreams

    def listed_adapters(self) -> list[str]:
        """The adapters of this pool's model its upstreams list (vLLM's servers list each
        with `parent` set to its base model), as of the last probes."""
        return self._pool.listed_adapters(self.model)

    async def generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        # `priority` is this gateway's own queue order (its keys' ranks and shares), not sent:
        # an upstream orders its own queue, and vLLM's server refuses any priority but 0
        # unless it schedules by priority (docs/upstream.md).
        model = adapter or self.model
        if prompt.images:
            # Megabytes of images to encode: off the event loop.
            path, content = await asyncio.to_thread(self._request, model, prompt, options)
        else:
            path, content = self._request(model, prompt, options)
        records = reads_records(prompt.chat)
        # Passed through: one choice (`StreamReader._feed_raw` reads choice 0) without tools.
        raw = self._config.pass_through and options.pass_through and options.n == 1 and not records
        window = self._max_model_len

        def reader() -> StreamReader:
            return StreamReader(options.n, records, raw, window=window)

        listing = self._pool.listing(adapter)
        exchange, first, retries = await self._dispatcher.open(
            prompt, path, content, reader, adapter, listing
        )
        # Output has begun: from here on, what fails ends the response.
        async with contextlib.aclosing(rest(exchange, first)) as steps:
            async for step in steps:
                if retries:
                    step.retried = True
                yield step

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        """The upstreams' `/v1/embeddings` for every prompt in one request (token ids where
        the pool has a tokenizer, else the texts), with the pool's retries and breakers. Each
        input's tokens: its ids, or without ids its share of the upstream's count by
        length."""
        texts = [p.text or "" for p in prompts]
        body: dict[str, Any] = {
            "model": self.model,
            "input": [p.ids if p.ids else p.text or "" for p in prompts],
            "encoding_format": "float",
        }
        if dimensions is not None:
            body["dimensions"] = dimensions
        answer = await self.post_json("/embeddings", body)
        try:
            data = sorted(answer["data"], key=lambda item: int(item["index"]))
            vectors = [[float(x) for x in item["embedding"]] for item in data]
            reported = (answer.get("usage") or {}).get("prompt_tokens")
            total = token_count(reported, self._max_model_len * len(prompts)) or 0
        except (KeyError, TypeError, ValueError) as exc:
            raise BadGatewayError("The upstream answered embeddings in another shape.") from exc
        if len(vectors) != len(prompts):
            raise BadGatewayError(
                f"The upstream answered {len(vectors)} embeddings for {len(prompts)} inputs."
            )
        counts = [p.length for p in prompts]
        if not all(counts):
            length = sum(len(t) for t in texts) or 1
            counts = [
                p.length or round(total * len(t) / length)
                for p, t in zip(prompts, texts, strict=True)
            ]
        return [Embedding(v, c) for v, c in zip(vectors, counts, strict=True)]

    async def check_dimensions(self, dimensions: int) -> None:
        """The upstream checks `dimensions` itself; its refusal is a 400 from it."""

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` (under /v1) on an upstream the balancer picks, with the
        pool's retries, breakers and error mapping, and its JSON answer."""
        return await self._dispatcher.post_json(path, body)

    async def check_structured(self, structured: StructuredOutput) -> None:
        """The upstream checks its constraints itself; its refusal is a 400 from it."""

    def load(self) -> EngineLoad | None:
        """Not known: an upstream's scheduler is its own (and may serve others too)."""
        return None

    async def check_health(self) -> None:
        await self._pool.check_health()

    def watch_health(self) -> None:
        """Probe every upstream every `health_interval` seconds, until shutdown."""
        self._pool.watch_health()

    async def shutdown(self) -> None:
        await self._pool.close()
