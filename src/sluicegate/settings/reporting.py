"""How settings are named and shown: the environment prefix, the settings never echoed,
URLs with their credentials hidden, and validation errors as one line per bad value."""

from __future__ import annotations

import re

from pydantic import ValidationError

# Settings whose values must never be echoed, not even in an error message.
SECRET_SETTINGS = frozenset(
    {
        "api_keys",
        "admin_api_keys",
        "metrics_api_keys",
        "redis_url",
        "rate_limit_redis_url",
        "upstream_api_key",
        "reasoning_key",
        "reasoning_previous_keys",
    }
)
ENV_PREFIX = "SLUICEGATE_"


def redact_url(url: str) -> str:
    """A URL as it may be shown: what comes before an `@` (a user and password) and its
    query or fragment (which can hold a token) replaced by `***`. Read from the raw text,
    not parsed: a URL too broken to parse may hold credentials too."""
    url = url.strip()
    cut = re.search(r"[?#]", url)
    head = url if cut is None else url[: cut.start()]
    scheme = head.find("://")
    start = scheme + 3 if scheme >= 0 else 0
    at = head.rfind("@", start)
    if at >= 0:
        head = head[:start] + "***" + head[at:]
    return head if cut is None else head + "?***"


def describe_error(exc: ValidationError) -> str:
    """One line per bad value, naming the setting as users spell it in the environment."""
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        name = (ENV_PREFIX + loc[0].upper()) if loc else "settings"
        allowed = ""
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            allowed = f" (allowed: {ctx['expected']})"
        given = err.get("input")
        if loc and loc[0] == "upstream_urls" and isinstance(given, str):
            given = ",".join(redact_url(url) for url in given.split(","))
        secret = bool(loc) and loc[0] in SECRET_SETTINGS
        shown = f"={given!r}" if loc and not secret and not isinstance(given, dict) else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"invalid setting {name}{shown}: {msg}{allowed}")
    return "\n".join(lines)
