"""Images in requests: which addresses the gateway may fetch them from, the bounds on each,
and how upstreams get them (`media`, docs/operations.md#images)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from sluicegate.media.policy import AddressPolicy


class MediaSettings(BaseModel):
    """How the gateway reads the images of requests."""

    media_allowed_hosts: str = Field(
        default="",
        description="Comma-separated host names, addresses and CIDR ranges that image URLs may "
        "reach although private, loopback, link-local or metadata addresses are refused (an "
        "address allows only itself: 127.0.0.2 does not allow 127.0.0.1). The address "
        "checked is the one connected to, after every redirect.",
    )
    media_fetch_urls: bool = Field(
        default=True,
        description="Fetch images named by http(s) URL; false: only inline images (data: URIs) "
        "are read, a URL gets a 400.",
    )
    media_max_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Bytes one image may have, fetched or inline (an inline one also counts "
        "against MAX_REQUEST_BYTES).",
    )
    media_max_pixels: int = Field(
        default=8_388_608,
        ge=1,
        le=64 * 1024 * 1024,
        description="Pixels (width times height) one image may have, checked before it is decoded.",
    )
    media_max_images: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Images one request may hold (also vLLM's `limit_mm_per_prompt`).",
    )
    media_fetch_timeout: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="Seconds one image's fetch may take in all: names, connections, up to 3 "
        "redirects and the body.",
    )
    media_upstream_urls: Literal["inline", "forward"] = Field(
        default="inline",
        description="How upstreams get images: `inline` (data: URIs of the bytes the gateway "
        "read; an upstream never fetches) or `forward` (the client's URL, once the gateway "
        "fetched it under its policy: for trusted upstreams that fetch themselves).",
    )
    media_upstream_image_tokens: int = Field(
        default=1024,
        ge=0,
        description="Tokens the token budget counts for an image sent to an upstream (an "
        "estimate; the upstream's usage gives the count the response and the ledger use).",
    )

    @field_validator("media_allowed_hosts")
    @classmethod
    def _check_hosts(cls, value: str) -> str:
        AddressPolicy.parse(value)
        return value
