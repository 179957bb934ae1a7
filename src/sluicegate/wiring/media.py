"""Reading the images of requests: the address policy and the bounds of the settings."""

from __future__ import annotations

from sluicegate.media.fetch import Fetcher, FetchLimits
from sluicegate.media.loader import MediaLoader
from sluicegate.media.policy import AddressPolicy
from sluicegate.settings import Settings


def media_loader(settings: Settings) -> MediaLoader:
    limits = FetchLimits(max_bytes=settings.media_max_bytes, timeout=settings.media_fetch_timeout)
    return MediaLoader(
        Fetcher(AddressPolicy.parse(settings.media_allowed_hosts), limits),
        max_pixels=settings.media_max_pixels,
        max_images=settings.media_max_images,
        fetch_urls=settings.media_fetch_urls,
    )
