"""A traffic profile (`observability.traffic_format`) read, checked and split.

A profile that cannot be tuned on is refused before anything starts, naming the line (from
1, the header included) and the field: a line that is not a JSON object, a missing field or
one of the wrong type, time going backwards, a request longer than the model's window, fewer
than `MIN_REQUESTS` requests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sluicegate.observability.traffic_format import (
    APIS,
    BLOCK_SIZE,
    CACHE_RESULTS,
    FIELDS,
    FORMAT,
    FORMAT_VERSION,
)

MIN_REQUESTS = 200
"""Fewer engine requests say too little of a traffic to tune on."""


class ProfileError(Exception):
    """A profile that cannot be tuned on; `line` counts from 1, the header included."""

    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(f"line {line}: {field}: {message}")
        self.line = line
        self.field = field


@dataclass(frozen=True, slots=True)
class Request:
    """One engine request of a profile."""

    t: float
    input_tokens: int
    output_tokens: int
    max_tokens: int
    stream: bool
    api: str
    priority: int
    cache: str
    finish_reason: str | None
    blocks: tuple[int, ...] = ()

    def line(self) -> dict[str, Any]:
        values = asdict(self)
        values["blocks"] = list(self.blocks)
        return values


@dataclass(frozen=True, slots=True)
class Profile:
    requests: tuple[Request, ...]
    block_size: int = BLOCK_SIZE
    header: dict[str, Any] = field(default_factory=dict)
    """What else the header said (the capture's sample rate, the model's window)."""

    @property
    def span(self) -> float:
        """Seconds from the first arrival to the last."""
        return self.requests[-1].t - self.requests[0].t if self.requests else 0.0

    def shares_prefixes(self) -> bool:
        """Whether requests share prefix blocks (more than 5% of the blocks seen are seen
        again): only then can prefix caching matter."""
        seen: set[int] = set()
        repeats = total = 0
        for request in self.requests:
            for block in request.blocks:
                total += 1
                repeats += block in seen
                seen.add(block)
        return total > 0 and repeats > 0.05 * total

    def has_priorities(self) -> bool:
        return len({r.priority for r in self.requests}) > 1

    def write(self, path: Path) -> None:
        header = {
            **self.header,
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "block_size": self.block_size,
        }
        lines = [json.dumps(header), *(json.dumps(r.line()) for r in self.requests)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_profile(path: Path, max_model_len: int | None = None) -> Profile:
    """The profile in `path`; `ProfileError` (line and field) when it cannot be tuned on."""
    with path.open(encoding="utf-8") as lines:
        return parse_profile(lines, max_model_len)


def parse_profile(lines: Iterable[str], max_model_len: int | None = None) -> Profile:
    numbered = iter(enumerate(lines, start=1))
    first = next(numbered, None)
    if first is None:
        raise ProfileError(1, "format", "the profile is empty")
    header = _object(*first)
    if header.get("format") != FORMAT:
        raise ProfileError(1, "format", f"not a traffic profile (the header says {FORMAT!r})")
    if header.get("version") != FORMAT_VERSION:
        raise ProfileError(1, "version", f"version {header.get('version')!r} is not known")
    block_size = header.get("block_size")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ProfileError(1, "block_size", "a positive whole number of tokens")
    window = max_model_len or header.get("max_model_len")
    if window is not None and (
        not isinstance(window, int | float) or window != int(window) or window < 1
    ):
        raise ProfileError(1, "max_model_len", "a positive whole number of tokens")
    window = None if window is None else int(window)
    requests: list[Request] = []
    last = 0
    for number, text in numbered:
        if not text.strip():
            continue
        request = _request(number, _object(number, text), block_size)
        if requests and request.t < requests[-1].t:
            raise ProfileError(number, "t", "time goes backwards (requests are in arrival order)")
        if isinstance(window, int) and request.input_tokens + request.max_tokens > window:
            raise ProfileError(
                number,
                "input_tokens",
                f"{request.input_tokens} in and {request.max_tokens} out do not fit the "
                f"model's window of {window} tokens",
            )
        requests.append(request)
        last = number
    if len(requests) < MIN_REQUESTS:
        raise ProfileError(
            max(last, 1),
            "requests",
            f"{len(requests)} engine requests; at least {MIN_REQUESTS} are needed to tune on",
        )
    extra = {k: v for k, v in header.items() if k not in ("format", "version", "block_size")}
    return Profile(tuple(requests), block_size, extra)


def split_in_time(profile: Profile, held_out: float = 0.25) -> tuple[Profile, Profile]:
    """The profile cut in time: the first part (to search on) and the last `held_out` share
    of its span (to confirm on), each starting at its own time 0."""
    cut = profile.requests[0].t + (1 - held_out) * profile.span
    search = [r for r in profile.requests if r.t < cut]
    confirm = [r for r in profile.requests if r.t >= cut]
    if not search or not confirm:
        raise ValueError("the profile's requests all arrive at once: it cannot be split in time")
    return _rebased(profile, search), _rebased(profile, confirm)


def _rebased(profile: Profile, requests: list[Request]) -> Profile:
    start = requests[0].t if requests else 0.0
    moved = tuple(replace(r, t=r.t - start) for r in requests)
    return Profile(moved, profile.block_size, dict(profile.header))


def _object(number: int, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(number, "json", f"not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ProfileError(number, "json", "a line is a JSON object")
    return value


def _request(number: int, value: dict[str, Any], block_size: int) -> Request:
    for name, types in FIELDS.items():
        if name not in value:
            raise ProfileError(number, name, "missing")
        got = value[name]
        if not isinstance(got, types) or (isinstance(got, bool) and bool not in types):
            raise ProfileError(number, name, f"{type(got).__name__} where {_names(types)}")
    if not math.isfinite(value["t"]):
        raise ProfileError(number, "t", "not a finite number")
    for name in ("input_tokens", "output_tokens", "max_tokens", "t"):
        if value[name] < (1 if name in ("input_tokens", "max_tokens") else 0):
            raise ProfileError(number, name, "out of range")
    if value["output_tokens"] > value["max_tokens"]:
        raise ProfileError(number, "output_tokens", "more than the request's max_tokens")
    if value["api"] not in APIS:
        raise ProfileError(number, "api", f"one of {', '.join(APIS)}")
    if value["cache"] not in CACHE_RESULTS:
        raise ProfileError(number, "cache", f"one of {', '.join(CACHE_RESULTS)}")
    blocks = value["blocks"]
    if any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in blocks):
        raise ProfileError(number, "blocks", "positive whole numbers")
    if len(blocks) > -(-value["input_tokens"] // block_size):
        raise ProfileError(number, "blocks", "more blocks than the input tokens fill")
    return Request(
        t=float(value["t"]),
        input_tokens=value["input_tokens"],
        output_tokens=value["output_tokens"],
        max_tokens=value["max_tokens"],
        stream=value["stream"],
        api=value["api"],
        priority=value["priority"],
        cache=value["cache"],
        finish_reason=value["finish_reason"],
        blocks=tuple(blocks),
    )


def _names(types: tuple[type, ...]) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}
    spelled = [names.get(t, "null" if t is type(None) else t.__name__) for t in types]
    return " or ".join(dict.fromkeys(spelled))
