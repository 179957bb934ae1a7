"""The memos that let a repeated request body skip the pipeline on a cache hit.

A request body that once went the whole way (validation, tokenization, token budget, cache
lookup) leaves behind its `HitShape`, noted by `ResponseCache.lookup` under the body's
fingerprint: the cache key it maps to, the prompt tokens it is charged, its budget headers and
how it is rendered. When an identical body (same JSON up to key order and whitespace, same
path, same key namespace) comes again, `http.cache_hits` finds the shape here and answers from
the entry before routing. Only bodies that went the whole way are ever looked up this way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from dataclasses import dataclass

from sluicegate.inference.run import Run
from sluicegate.lru import BoundedLRU
from sluicegate.wire.formats import ResponseFormat

# Bounds of the memos; worst case 16 MiB of remembered bodies.
MAX_SHAPES = 8192
MAX_FINGERPRINTS = 4096
MAX_REMEMBERED_BODY = 4096
MAX_FINGERPRINTED_BODY = 64 * 1024
"""Larger bodies take the full path every time: parsing and re-serializing them here would
hold the event loop (the cache still answers them, by their token ids)."""


@dataclass(frozen=True, slots=True)
class HitShape:
    """What answering a request body from the cache takes."""

    key: str
    model: str
    """The served model the body was routed to: answered here only while that name still
    serves the same weights (an adapter may have been unloaded, or loaded again from
    elsewhere, since)."""
    identity: str
    format: ResponseFormat
    """The run's format; each hit renders through a renewed copy (tool calls included)."""
    stream: bool
    include_usage: bool
    prompt_tokens: int
    headers: tuple[tuple[bytes, bytes], ...] = ()
    """The budget headers of the original, encoded."""
    body_key: Hashable | None = None
    """What the body rendered for it depends on besides the entry, when that body can be
    kept and reused (`wire.body_template`); None: rendered for each hit."""

    @classmethod
    def of(cls, key: str, run: Run, stream: bool) -> HitShape:
        budget = tuple(
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in (run.budget.headers() if run.budget is not None else {}).items()
        )
        fmt = run.format
        # The model is the process's; the rest of such a format is these.
        body_key = (type(fmt), stream, run.include_usage) if fmt.renders_alike() else None
        return cls(
            key,
            run.model,
            run.identity,
            fmt,
            stream,
            run.include_usage,
            run.prompt_tokens,
            budget,
            body_key,
        )


class FastPath:
    """Request body -> fingerprint -> `HitShape`, both bounded LRUs."""

    def __init__(self, enabled: bool, per_key: bool) -> None:
        self._enabled = enabled
        self._per_key = per_key
        self._shapes: BoundedLRU[str, HitShape] = BoundedLRU(MAX_SHAPES)
        self._fingerprints: BoundedLRU[tuple[str, str, bytes], str] = BoundedLRU(MAX_FINGERPRINTS)

    def fingerprint(self, path: str, body: bytes, key_id: str) -> str | None:
        """A digest of the request body up to JSON layout, or None if it is not a JSON object
        (or the cache is off)."""
        if not self._enabled or len(body) > MAX_FINGERPRINTED_BODY:
            return None
        namespace = key_id if self._per_key else ""
        # The same bytes again (a client repeating itself) skip parsing and re-serializing.
        seen = self._fingerprints.get((path, namespace, body))
        if seen is not None:
            return seen
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(parsed, dict):
            return None
        canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{path}\0{namespace}\0{canonical}".encode()).hexdigest()
        if len(body) <= MAX_REMEMBERED_BODY:
            self._fingerprints.put((path, namespace, body), digest)
        return digest

    def shape(self, fingerprint: str) -> HitShape | None:
        return self._shapes.get(fingerprint)

    def note(self, fingerprint: str, shape: HitShape) -> None:
        self._shapes.put(fingerprint, shape)
