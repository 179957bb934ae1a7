"""A stored response: the response object and the conversation it continues.

`previous_response_id` continues from `items` (every input item the response was given,
the earlier conversation included, but not its `instructions`) followed by the response's
output. The record is stored as compact JSON; `encode` refuses one larger than the bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluicegate.wire.responses import Item


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    """The response object, as `GET /v1/responses/{id}` returns it."""
    items: list[Item]
    """The conversation's input items: the previous response's conversation, then `input`."""

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def conversation(self) -> list[Item]:
        """What a response continuing this one starts from: its input, then its output."""
        return [*self.items, *self.response.get("output", [])]

    def encode(self) -> bytes:
        record = {"response": self.response, "items": self.items}
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()

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
