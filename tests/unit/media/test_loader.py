"""A request's images read: inline base64 (data: URIs and bare), their pixels within the bound
and as vLLM's loader gives them, their digests, the count bound, and errors naming the part."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import threading
import zlib

import pytest
from PIL import Image

from sluicegate.errors import MediaError
from sluicegate.media import data_uri, loader
from sluicegate.media.decode import decode
from sluicegate.media.fetch import Fetcher, FetchLimits
from sluicegate.media.loader import ImageSource, MediaLoader
from sluicegate.media.policy import AddressPolicy
from sluicegate.observability.metrics import MEDIA_FETCHES, MEDIA_REFUSALS
from sluicegate.offload import Offload
from tests.support.media_server import answer, media_server, png

MAX_BYTES = 256 * 1024


def _loader(max_images: int = 4, max_pixels: int = 1_000_000) -> MediaLoader:
    fetcher = Fetcher(AddressPolicy.parse("127.0.0.2"), FetchLimits(max_bytes=MAX_BYTES))
    # inline_limit 0: every decode goes through the pool, as a large one would.
    return MediaLoader(fetcher, max_pixels, max_images, Offload(inline_limit=0))


def _uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _jpeg(size: tuple[int, int], orientation: int | None = None) -> bytes:
    image = Image.new("RGB", size, (10, 120, 200))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif)
    return buffer.getvalue()


async def test_inline_images_are_read_with_their_digests_in_order() -> None:
    red, blue = png(color=(255, 0, 0)), png(4, 6, (0, 0, 255))
    loaded = await _loader().load_all(
        [
            ImageSource("messages[0].content[0]", url=_uri(red)),
            ImageSource("messages[0].content[1]", base64=base64.b64encode(blue).decode()),
        ]
    )
    assert [image.digest for image in loaded] == [
        hashlib.sha256(red).hexdigest(),
        hashlib.sha256(blue).hexdigest(),
    ]
    assert [image.image.size for image in loaded] == [(8, 8), (4, 6)]
    assert loaded[1].image.getpixel((0, 0)) == (0, 0, 255)
    assert loaded[0].data_uri() == _uri(red)


async def test_a_fetched_image_is_read_and_counted() -> None:
    before = MEDIA_FETCHES.labels("ok")._value.get()
    async with media_server("127.0.0.2", {"/a.png": answer(png())}) as server:
        [image] = await _loader().load_all([ImageSource("p", url=server.url("/a.png"))])
    assert image.format == "png" and image.media_type == "image/png"
    assert MEDIA_FETCHES.labels("ok")._value.get() == before + 1


async def test_an_error_names_the_part_and_is_counted_by_reason() -> None:
    before = MEDIA_REFUSALS.labels("not_an_image")._value.get()
    with pytest.raises(MediaError) as caught:
        await _loader().load_all(
            [
                ImageSource("messages[0].content[0].image_url", url=_uri(png())),
                ImageSource("messages[0].content[2].image_url", url=_uri(b"%PDF-1.7 not this")),
            ]
        )
    assert caught.value.param == "messages[0].content[2].image_url"
    assert caught.value.message.startswith("messages[0].content[2].image_url: ")
    assert caught.value.reason == "not_an_image"
    assert MEDIA_REFUSALS.labels("not_an_image")._value.get() == before + 1


async def test_more_images_than_allowed_are_refused_before_any_is_read() -> None:
    sources = [ImageSource(f"p{i}", url="http://127.0.0.1:1/never") for i in range(5)]
    with pytest.raises(MediaError) as caught:
        await _loader(max_images=4).load_all(sources)
    assert caught.value.reason == "too_many_images"
    assert "5 images" in caught.value.message


def _header_only_png(width: int, height: int) -> bytes:
    """A PNG's header and a few bytes of pixel data: its size can be read, its pixels not."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels)


async def test_pixels_past_the_bound_are_refused_from_the_header() -> None:
    wide = png(2000, 1000)  # a few KiB of PNG, 2 million pixels
    with pytest.raises(MediaError) as caught:
        await _loader(max_pixels=1_000_000).load(ImageSource("p", url=_uri(wide)))
    assert caught.value.reason == "too_many_pixels"
    assert "2000x1000" in caught.value.message
    # Refused before any pixel is read: this one has none to read.
    with pytest.raises(MediaError) as caught:
        decode(_header_only_png(9000, 9000), "png", 1_000_000)
    assert caught.value.reason == "too_many_pixels"


async def test_a_small_image_is_decoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []

    def recorded(data: bytes, kind: str, max_pixels: int) -> Image.Image:
        threads.append(threading.current_thread().name)
        return decode(data, kind, max_pixels)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "decode", recorded)
    media = MediaLoader(_loader().fetcher, 1_000_000, 4, Offload())  # the usual inline limit
    await media.load(ImageSource("p", url=_uri(png())))
    assert len(threads) == 1 and threads[0] != threading.main_thread().name


def test_transparency_is_laid_on_white_and_exif_orientation_applied() -> None:
    clear = decode(png(2, 2, (0, 0, 0, 0)), "png", 100)
    assert clear.mode == "RGB" and clear.getpixel((0, 0)) == (255, 255, 255)
    turned = decode(_jpeg((40, 20), orientation=6), "jpeg", 10_000)
    assert turned.size == (20, 40)
    assert decode(_jpeg((40, 20)), "jpeg", 10_000).size == (40, 20)


def test_bytes_that_are_not_the_sniffed_format_are_undecodable() -> None:
    noise = Image.frombytes("RGB", (64, 64), bytes(range(256)) * 48)
    buffer = io.BytesIO()
    noise.save(buffer, "PNG")
    for broken in (png()[:40], buffer.getvalue()[: len(buffer.getvalue()) * 2 // 3]):
        with pytest.raises(MediaError) as caught:
            decode(broken, "png", 1_000_000)
        assert caught.value.reason == "undecodable"


def test_padding_before_the_end_is_refused_across_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_uri, "CHUNK", 8)
    assert data_uri.decode("YWJjZGVmZ2hpams=", 100) == b"abcdefghijk"
    with pytest.raises(MediaError) as caught:
        data_uri.decode("YWJjZA==YWJj", 100)
    assert caught.value.reason == "bad_data_uri"


def test_base64_with_line_breaks_decodes_and_bad_base64_is_refused() -> None:
    data = bytes(range(256)) * 5000
    assert data_uri.decode(base64.encodebytes(data).decode(), len(data)) == data
    for bad in ("abc", "ab!d", "YQ==YQ==", "aGk\u0660"):
        with pytest.raises(MediaError) as caught:
            data_uri.decode(bad, 1000)
        assert caught.value.reason == "bad_data_uri", bad
    with pytest.raises(MediaError) as caught:
        data_uri.decode(base64.b64encode(data).decode(), len(data) - 1)
    assert caught.value.reason == "too_large"


@pytest.mark.parametrize(
    "uri",
    ["data:image/png,plain", "data:text/plain;base64,aGk=", "image/png;base64,aGk=", "data:"],
)
def test_a_data_uri_that_is_not_a_base64_image_is_refused(uri: str) -> None:
    with pytest.raises(MediaError) as caught:
        data_uri.split(uri)
    assert caught.value.reason == "bad_data_uri"


def test_a_data_uri_without_a_media_type_is_judged_by_its_bytes() -> None:
    assert data_uri.split("data:;base64,aGk=") == ("", "aGk=")
