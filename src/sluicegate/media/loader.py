"""A request's images, read: fetched (URLs) or decoded (inline base64), sniffed, bounded, and
their pixels read off the event loop, each with the SHA-256 digest of its bytes (the cache
key and the engine's multimodal ids take the digest, never the URL)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from dataclasses import dataclass, field

from PIL import Image

from sluicegate.errors import MediaError
from sluicegate.media import data_uri
from sluicegate.media.decode import decode
from sluicegate.media.fetch import Fetcher, FetchLimits
from sluicegate.media.formats import MEDIA_TYPES, ImageFormat, sniff
from sluicegate.media.policy import AddressPolicy
from sluicegate.observability.metrics import (
    MEDIA_FETCH_BYTES,
    MEDIA_FETCH_SECONDS,
    MEDIA_FETCHES,
    MEDIA_REFUSALS,
)
from sluicegate.offload import Offload
from sluicegate.offload import offload as shared_offload


@dataclass(frozen=True, slots=True)
class LoadedImage:
    data: bytes
    """The image's bytes as the client (or its server) sent them."""
    format: ImageFormat
    digest: str
    """SHA-256 of `data`, hex."""
    image: Image.Image = field(repr=False, compare=False)
    """Its pixels, RGB."""

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    def data_uri(self) -> str:
        """The image inline, as upstreams get it (they never fetch a client's URL)."""
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True, slots=True)
class ImageSource:
    """One image part of a request: where it is (a URL, a data: URI, or bare base64 with its
    declared media type), and the request's name for the part (an error names it)."""

    param: str
    url: str | None = None
    base64: str | None = None


MAX_PIXELS = 8_388_608
MAX_IMAGES = 8
URLS_OFF = "this gateway reads images sent inline only (data: URIs), not by URL"


class MediaLoader:
    def __init__(
        self,
        fetcher: Fetcher,
        max_pixels: int = MAX_PIXELS,
        max_images: int = MAX_IMAGES,
        offload: Offload | None = None,
        fetch_urls: bool = True,
    ) -> None:
        """`fetch_urls` false: an http(s) URL is refused (`urls_off`) unfetched."""
        self.fetcher = fetcher
        self.max_pixels = max_pixels
        self.max_images = max_images
        self.offload = offload or shared_offload
        self.fetch_urls = fetch_urls

    @classmethod
    def default(cls) -> MediaLoader:
        """The settings' defaults: no address allowed beyond the public ones."""
        return cls(Fetcher(AddressPolicy(), FetchLimits()))

    @property
    def max_bytes(self) -> int:
        return self.fetcher.limits.max_bytes

    async def load_all(self, sources: list[ImageSource]) -> list[LoadedImage]:
        """Every image of a request, in order, read side by side; the first refusal ends
        them all, as a `MediaError` naming its part."""
        self.check_count(len(sources))
        if len(sources) == 1:
            return [await self.load(sources[0])]
        tasks = [asyncio.ensure_future(self.load(source)) for source in sources]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # The first error is the request's; the others' reads stop here.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def check_count(self, count: int) -> None:
        if count > self.max_images:
            MEDIA_REFUSALS.labels("too_many_images").inc()
            raise MediaError(
                "too_many_images",
                f"the request has {count} images, more than the {self.max_images} allowed",
            )

    async def load(self, source: ImageSource) -> LoadedImage:
        try:
            data, kind = await self._bytes(source)
            # Always off the loop: a few KiB of image may hold millions of pixels, and the
            # digest of megabytes takes milliseconds.
            image, digest = await self.offload.call(_read, data, kind, self.max_pixels)
        except MediaError as exc:
            MEDIA_REFUSALS.labels(exc.reason).inc()
            raise exc.for_part(source.param) from None
        return LoadedImage(data, kind, digest, image)

    async def _bytes(self, source: ImageSource) -> tuple[bytes, ImageFormat]:
        if source.base64 is not None:
            payload = source.base64
        elif source.url is not None and source.url[:5].lower() == "data:":
            _, payload = data_uri.split(source.url)
        elif source.url is not None:
            if not self.fetch_urls:
                raise MediaError("urls_off", URLS_OFF)
            return await self._fetch(source.url)
        else:
            raise MediaError("bad_url", "the image part has no URL and no data")
        data = await self.offload.run(len(payload), data_uri.decode, payload, self.max_bytes)
        kind = sniff(data[:16])
        if kind is None:
            raise MediaError(
                "not_an_image", "the image's bytes are not a PNG, JPEG, GIF or WebP image"
            )
        return data, kind

    async def _fetch(self, url: str) -> tuple[bytes, ImageFormat]:
        started = time.perf_counter()
        try:
            fetched = await self.fetcher.fetch(url)
        except MediaError as exc:
            failed = exc.reason in ("status", "unreachable", "unresolved", "bad_response")
            MEDIA_FETCHES.labels("failed" if failed else "refused").inc()
            raise
        finally:
            MEDIA_FETCH_SECONDS.observe(time.perf_counter() - started)
        MEDIA_FETCHES.labels("ok").inc()
        MEDIA_FETCH_BYTES.inc(len(fetched.data))
        return fetched.data, fetched.format


def _read(data: bytes, kind: ImageFormat, max_pixels: int) -> tuple[Image.Image, str]:
    """The image's pixels and its bytes' digest (in the offload pool)."""
    return decode(data, kind, max_pixels), hashlib.sha256(data).hexdigest()
