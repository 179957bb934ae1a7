"""The embedding cache: each input's vector kept on its own, so a batch computes only the inputs
not seen before.

An input's key holds the model's identity (its weights), the input (its text, or its token
ids), `dimensions` and `truncate_prompt_tokens`, and, as for the response cache, the API key's
id unless the cache is shared across keys. Its value is the vector (float32, little-endian)
and the tokens the engine counted for it. Entries live in the response cache's store (Redis,
shared by replicas, or this process's), under `<prefix>:emb:v1:`, with their own TTL;
embeddings are deterministic, so they are always kept, whatever the response cache's policy.

A request runs as an `EmbeddingBatch`: `look_up` (one round trip for every input), then the
inputs not found are computed in one engine call (`compute`), identical inputs once, and an
input another request is computing right now is waited for rather than computed again
(single flight, in this process). What is computed is written in the background. A store that
fails or is slow is passed over: everything is computed, nothing fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sluicegate.cache.store import CacheStore, StoreError
from sluicegate.engine.protocol import Embedding, Prompt
from sluicegate.observability.metrics import EMBEDDING_INPUTS, EMBEDDING_STORE_ERRORS
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.offload import offload

logger = logging.getLogger(__name__)

KEY_VERSION = "v1"
Outcome = Literal["HIT", "PARTIAL", "MISS"]
Compute = Callable[[list[Prompt]], Awaitable[list[Embedding]]]


@dataclass(frozen=True, slots=True)
class EmbeddingCacheConfig:
    prefix: str = "sluicegate"
    ttl_seconds: float = 7 * 24 * 3600.0
    per_key: bool = False
    """Inputs kept apart per API key (as the response cache keeps answers)."""
    retry_interval: float = 5.0
    """Seconds the store is passed over after it failed."""


def encode_embedding(embedding: Embedding) -> bytes:
    vector = embedding.vector
    return struct.pack(f"<I{len(vector)}f", embedding.prompt_tokens, *vector)


def decode_embedding(data: bytes) -> Embedding:
    if len(data) < 4 or (len(data) - 4) % 4:
        raise ValueError("not an encoded embedding")
    count = (len(data) - 4) // 4
    tokens, *vector = struct.unpack(f"<I{count}f", data)
    return Embedding(list(vector), tokens)


def _decoded(values: Sequence[bytes | None]) -> list[Embedding | None]:
    """The values a store holds, decoded one by one (in a thread when they are many:
    `offload`); what is not an encoded embedding is not found."""
    found: list[Embedding | None] = []
    for value in values:
        try:
            found.append(None if value is None else decode_embedding(value))
        except ValueError:
            found.append(None)
    return found


def _encoded(items: list[tuple[str, Embedding]]) -> list[tuple[str, bytes]]:
    return [(key, encode_embedding(embedding)) for key, embedding in items]


class EmbeddingCache:
    def __init__(self, store: CacheStore, config: EmbeddingCacheConfig | None = None) -> None:
        self.store = store
        self._config = config or EmbeddingCacheConfig()
        self._flights: dict[str, asyncio.Future[Embedding]] = {}
        self._down_until = 0.0
        self._warning = ThrottledWarning(logger)
        self._background: set[asyncio.Task[None]] = set()

    def batch(
        self,
        model: str,
        identity: str,
        inputs: Sequence[str | list[int]],
        dimensions: int | None,
        truncate: int | None,
        key_id: str,
    ) -> EmbeddingBatch:
        namespace = key_id if self._config.per_key else ""
        keys = [self.key(model, identity, item, dimensions, truncate, namespace) for item in inputs]
        return EmbeddingBatch(self, model, list(inputs), keys)

    def key(
        self,
        model: str,
        identity: str,
        item: str | list[int],
        dimensions: int | None,
        truncate: int | None,
        namespace: str = "",
    ) -> str:
        kind, content = ("text", item) if isinstance(item, str) else ("ids", item)
        described = json.dumps(
            [identity, namespace, kind, content, dimensions, truncate],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        digest = hashlib.sha256(described.encode()).hexdigest()
        return f"{self._config.prefix}:emb:{KEY_VERSION}:{model}:{digest}"

    async def read(self, keys: list[str]) -> list[Embedding | None]:
        """What the store holds for `keys`; nothing (and a warning) when it fails."""
        if time.monotonic() < self._down_until:
            return [None] * len(keys)
        try:
            values = await self.store.get_many(keys)
        except StoreError as exc:
            self._failed(exc)
            return [None] * len(keys)
        size = sum(len(value) for value in values if value is not None)
        return await offload.run(size, _decoded, values)

    def write(self, items: list[tuple[str, Embedding]]) -> None:
        """Keep what was computed, in the background: the answer does not wait for it."""
        if not items or time.monotonic() < self._down_until:
            return
        task = asyncio.create_task(self._write(items))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _write(self, items: list[tuple[str, Embedding]]) -> None:
        ttl_ms = max(1, int(self._config.ttl_seconds * 1000))
        try:
            size = 4 * sum(len(e.vector) for _, e in items)
            encoded = await offload.run(size, _encoded, items)
            await self.store.set_many(encoded, ttl_ms)
        except StoreError as exc:
            self._failed(exc)

    def _failed(self, exc: StoreError) -> None:
        EMBEDDING_STORE_ERRORS.inc()
        self._down_until = time.monotonic() + self._config.retry_interval
        self._warning.warn("embedding cache store failed (%s): computing every input", exc)

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


@dataclass(slots=True)
class EmbeddingBatch:
    """One request's inputs on their way through the cache (see the module doc)."""

    cache: EmbeddingCache
    model: str
    inputs: list[str | list[int]]
    keys: list[str]
    found: list[Embedding | None] = field(default_factory=list)
    _leading: dict[str, int] = field(default_factory=dict)
    """Keys this request computes -> the first position holding it."""
    _following: dict[str, tuple[int, asyncio.Future[Embedding]]] = field(default_factory=dict)
    """Keys another request in flight computes -> a position holding it, and its result."""

    async def look_up(self) -> None:
        self.found = await self.cache.read(self.keys)
        flights = self.cache._flights
        for position, key in enumerate(self.keys):
            if self.found[position] is not None or key in self._leading or key in self._following:
                continue
            if key in flights:
                self._following[key] = (position, flights[key])
            else:
                self._leading[key] = position
        # Taken now, before any await: identical inputs from now on wait for this request.
        loop = asyncio.get_running_loop()
        for key in self._leading:
            flights[key] = loop.create_future()

    @property
    def outcome(self) -> Outcome:
        hits = sum(e is not None for e in self.found)
        if hits == len(self.keys):
            return "HIT"
        return "PARTIAL" if hits else "MISS"

    def missing(self) -> tuple[list[str | list[int]], list[int]]:
        """The inputs not found, once each, and their positions in the request: those this
        request computes, then those another request is computing (made ready too, in case
        that request fails)."""
        positions = [*self._leading.values(), *(p for p, _ in self._following.values())]
        return [self.inputs[p] for p in positions], positions

    def cached_tokens(self) -> int:
        return sum(e.prompt_tokens for e in self.found if e is not None)

    async def compute(self, prompts: list[Prompt], compute: Compute) -> list[Embedding]:
        """Every input's embedding, in order: found, computed here (from `prompts`, those of
        `missing()`, in one call), or computed by another request in flight (or here, if that
        request failed)."""
        leading = list(self._leading)
        mine = prompts[: len(leading)]
        theirs = dict(zip(self._following, prompts[len(leading) :], strict=True))
        try:
            computed = await compute(mine) if mine else []
        except BaseException as exc:
            self._settle(leading, exc)
            raise
        by_key = dict(zip(leading, computed, strict=True))
        self._settle(leading, by_key)
        waited = await asyncio.gather(
            *(asyncio.shield(f) for _, f in self._following.values()), return_exceptions=True
        )
        lost = [
            key
            for key, got in zip(self._following, waited, strict=True)
            if not isinstance(got, Embedding)
        ]
        followed = {
            key: got
            for key, got in zip(self._following, waited, strict=True)
            if isinstance(got, Embedding)
        }
        if lost:
            again = await compute([theirs[key] for key in lost])
            by_key.update(zip(lost, again, strict=True))
        result = []
        for position, key in enumerate(self.keys):
            found = self.found[position] or by_key.get(key) or followed.get(key)
            assert found is not None, "every input is found, computed or followed"
            result.append(found)
        EMBEDDING_INPUTS.labels(self.model, "cached").inc(sum(e is not None for e in self.found))
        EMBEDDING_INPUTS.labels(self.model, "computed").inc(len(by_key))
        self.cache.write(list(by_key.items()))
        return result

    def _settle(self, keys: list[str], outcome: dict[str, Embedding] | BaseException) -> None:
        """Tell the requests waiting on `keys` what came of them."""
        flights = self.cache._flights
        for key in keys:
            future = flights.pop(key, None)
            if future is None or future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(RuntimeError("the request computing it failed"))
                future.exception()  # marked as retrieved: it may have no follower
            else:
                future.set_result(outcome[key])

    def abandon(self) -> None:
        """Give up the keys this request was to compute (refused before it computed them):
        those waiting on them compute them themselves."""
        self._settle(list(self._leading), RuntimeError("abandoned"))
