"""JSON on the hot path: orjson, with Python's json for what orjson refuses.

Both write compact JSON in UTF-8 and read the same documents, but for edges orjson turns
down: writing a lone surrogate (Python's escapes it), a key that is not a string, an integer
past 64 bits; reading NaN or a surrogate escape. Those take Python's slower path instead of
failing.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """`value` as compact JSON in UTF-8 (as vLLM's server writes its events)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def loads(data: str | bytes) -> Any:
    """A JSON document; ValueError for what is not one."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
