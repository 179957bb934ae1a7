"""What the upstreams serve: found at start-up (`discover`: the first upstream that lists the
model, and its card), and refreshed with each health probe (`listing_of`, `refresh_listing`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from sluicegate.engine.upstream.server import Upstream

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT = 2.0
"""Seconds one `/v1/models` (or health) request may take."""


async def discover(
    upstreams: list[Upstream], wait: float, wanted: str | None = None
) -> tuple[Upstream, dict[str, Any]]:
    """The first upstream whose `/v1/models` lists the model (`wanted`, else its first one),
    and that model's card. What each upstream lists is kept (`Upstream.models`)."""
    deadline = time.monotonic() + wait
    while True:
        found: tuple[Upstream, dict[str, Any]] | None = None
        for upstream in upstreams:
            cards = await _cards(upstream, HEALTH_TIMEOUT)
            if cards is None:
                continue
            upstream.models = _parents(cards)
            if found is not None:
                continue
            card = _card_for(cards, wanted)
            if card is not None:
                if wanted is None and len(cards) > 1 and not _all_of(cards, card):
                    logger.warning(
                        "upstream %s serves %d models; sluicegate serves the first, %s "
                        "(`upstream_model` in a models file picks another)",
                        upstream.label,
                        len(cards),
                        card.get("id"),
                    )
                found = (upstream, card)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            names = ", ".join(u.label for u in upstreams)
            which = "any model" if wanted is None else f"the model {wanted!r}"
            raise UpstreamStartError(
                f"no upstream listed {which} in GET /v1/models within {wait:g} s ({names})"
            )
        await asyncio.sleep(1.0)


async def _cards(upstream: Upstream, wait: float) -> list[dict[str, Any]] | None:
    """The model cards of the upstream's `/v1/models`, or None if it did not answer so."""
    try:
        response = await upstream.client.get("/models", timeout=wait)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(cards, list):
        return None
    return [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]


def _card_for(cards: list[dict[str, Any]], wanted: str | None) -> dict[str, Any] | None:
    if wanted is not None:
        return next((c for c in cards if c["id"] == wanted), None)
    return cards[0] if cards else None


def _all_of(cards: list[dict[str, Any]], base: dict[str, Any]) -> bool:
    """Whether the other cards are the base model's adapters (vLLM lists them so)."""
    return all(c is base or c.get("parent") == base["id"] for c in cards)


def _parents(cards: list[dict[str, Any]]) -> dict[str, str | None]:
    parents: dict[str, str | None] = {}
    for card in cards:
        parent = card.get("parent")
        parents[card["id"]] = parent if isinstance(parent, str) else None
    return parents


def listing_of(response: httpx.Response) -> dict[str, str | None]:
    """A probe's `/v1/models` answer as a listing (empty if it is not one)."""
    try:
        cards = response.json().get("data")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(cards, list):
        return {}
    return _parents([c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)])


async def refresh_listing(upstream: Upstream, wait: float) -> None:
    cards = await _cards(upstream, wait)
    if cards is not None:
        upstream.models = _parents(cards)


class UpstreamStartError(Exception):
    """Upstream mode cannot start; one line for the operator."""
