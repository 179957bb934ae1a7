"""A stored response: the response object and the conversation it continues.

`previous_response_id` continues from `items` (every input item the response was given,
the earlier conversation included, but not its `instructions`) followed by the response's
output. The record is stored as compact JSON. Its items can be encoded first
(`encode_items`), to learn before answering whether the store can take the record at all;
`encode` then reuses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluicegate.wire.responses import Item


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    """The response object, as `GET /v1/responses/{id}` returns it."""
    items: list[Item]
    """The conversation's input items: the previous response's conversation, then `input`."""
    encoded_items: bytes | None = field(default=None, compare=False, repr=False)
    """`items` as `encode_items` encodes them, when they were measured already."""

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def conversation(self) -> list[Item]:
        """What a response continuing this one starts from: its input, then its output."""
        return [*self.items, *self.response.get("output", [])]

    def encode(self) -> bytes:
        """`{"response":…,"items":…}`, as compact JSON."""
        items = self.encoded_items if self.encoded_items is not None else encode_items(self.items)
        return b'{"response":' + _compact(self.response) + b',"items":' + items + b"}"

    @classmethod
    def decode(cls, data: bytes) -> StoredResponse:
        """The record in `data`; ValueError when it is not one."""
        record = json.loads(data)
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("response"), dict)
            or not isinstance(record.get("items"), list)
        ):
            raise ValueError("not a stored response")
        return cls(record["response"], record["items"])


def encode_items(items: list[Item]) -> bytes:
    """The items as a stored record holds them; a lower bound on the record's size."""
    return _compact(items)


def _compact(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
