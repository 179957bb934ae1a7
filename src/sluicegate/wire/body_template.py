"""A cached answer rendered once, then sent again and again with a fresh id and time.

Every hit on an entry renders the same completion the same way, but for the response's `id`
and `created`. `BodyTemplate.of` renders the answer once (JSON body or the whole event
stream) and cuts it where that response's id and creation time appear; `fill` puts in new
ones, so a hit on a hot entry costs a join instead of building and encoding the body again.
Only formats whose renderings differ in nothing else (`ResponseFormat.renders_alike`) are
kept this way.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sluicegate.wire.completion import Completion
from sluicegate.wire.events import RenderedAnswer, render_cached
from sluicegate.wire.formats import ResponseFormat

_BYTES_OVERHEAD = 33
"""What a bytes object costs beyond its contents (`sys.getsizeof(b"")`)."""
_TEMPLATE_OVERHEAD = 512
"""The template object, its tuples and headers."""
_IDS = random.Random()
"""Response ids need to be unique, not secret: a generator seeded from the system's
randomness, without a system call per hit (`uuid4` makes one)."""


@runtime_checkable
class _Identified(Protocol):
    id: str
    created: int


@dataclass(frozen=True, slots=True)
class BodyTemplate:
    layout: tuple[bytes, ...]
    """The body's pieces, with an empty slot wherever an id or a creation time goes."""
    id_slots: tuple[int, ...]
    created_slots: tuple[int, ...]
    headers: tuple[tuple[bytes, bytes], ...]
    """Content type (and the event stream's headers), encoded; a JSON body's length is
    added."""
    sized: bool
    """Whether the length goes in a header (JSON, not an event stream)."""
    size: int
    """Bytes of memory it holds, about."""

    @classmethod
    def of(
        cls, fmt: ResponseFormat, completion: Completion, stream: bool, include_usage: bool
    ) -> tuple[RenderedAnswer, BodyTemplate | None]:
        """The answer for one hit, rendered as usual, and the template it makes, if its
        format's renderings differ only in id and creation time."""
        fmt = fmt.renewed()
        answer = render_cached(fmt, completion, stream, include_usage)
        if not fmt.renders_alike() or not isinstance(fmt, _Identified):
            return answer, None
        return answer, cls._cut(answer, fmt.id.partition("-")[2], fmt.created)

    @classmethod
    def _cut(cls, answer: RenderedAnswer, unique: str, created: int) -> BodyTemplate | None:
        marker = b'"created":'
        stamp = marker + str(created).encode()
        layout: list[bytes] = []
        id_slots: list[int] = []
        created_slots: list[int] = []
        for n, part in enumerate(answer.body.split(unique.encode())):
            if n:
                id_slots.append(len(layout))
                layout.append(b"")
            for m, piece in enumerate(part.split(stamp)):
                if m:
                    layout.append(marker)
                    created_slots.append(len(layout))
                    layout.append(b"")
                layout.append(piece)
        # Quotes inside strings are escaped, so `"id":"` and `"created":` only ever match the
        # envelopes' fields: one id and one creation time per envelope, or no template.
        envelopes = answer.body.count(b'"id":"')
        if not envelopes or not len(id_slots) == len(created_slots) == envelopes:
            return None
        headers = encoded({k: v for k, v in answer.headers.items() if k != "content-length"})
        return cls(
            layout=tuple(layout),
            id_slots=tuple(id_slots),
            created_slots=tuple(created_slots),
            headers=tuple(headers),
            sized="content-length" in answer.headers,
            size=_TEMPLATE_OVERHEAD + sum(len(p) + _BYTES_OVERHEAD for p in layout),
        )

    def fill(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The answer for one more hit: the body with a new id and the current time, and
        its headers, encoded."""
        body = list(self.layout)
        unique = b"%032x" % _IDS.getrandbits(128)
        created = str(int(time.time())).encode()
        for slot in self.id_slots:
            body[slot] = unique
        for slot in self.created_slots:
            body[slot] = created
        data = b"".join(body)
        headers = list(self.headers)
        if self.sized:
            headers.append((b"content-length", str(len(data)).encode()))
        return data, headers


def encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers as ASGI sends them."""
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
