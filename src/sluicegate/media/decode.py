"""Reading an image's pixels: only the format its bytes showed, within the pixel bound, in
the steps vLLM's own media loader takes (so an engine gets what vLLM's server would give it):
the EXIF orientation applied, then RGB, transparency laid on white. Run it in a thread: Pillow
lets go of the GIL while it decodes."""

from __future__ import annotations

import contextlib
import io

from PIL import Image, ImageOps

from sluicegate.errors import MediaError
from sluicegate.media.formats import PILLOW_NAMES, ImageFormat

BACKGROUND = (255, 255, 255)


def decode(data: bytes, kind: ImageFormat, max_pixels: int) -> Image.Image:
    """The RGB image in `data` (of the sniffed format `kind`); `MediaError` if it cannot be
    read as that format or has more than `max_pixels` pixels (checked from its header,
    before any pixel is decoded)."""
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=[PILLOW_NAMES[kind]])
        width, height = image.size
        if width * height > max_pixels:
            raise MediaError(
                "too_many_pixels",
                f"the image has {width}x{height} pixels, more than the {max_pixels} allowed",
            )
        image.load()
        with contextlib.suppress(Exception):  # a broken EXIF block: the image as it is
            ImageOps.exif_transpose(image, in_place=True)
        return rgb(image)
    except MediaError:
        raise
    except Image.DecompressionBombError:  # past twice Pillow's own bound, read at open
        raise MediaError("too_many_pixels", "the image has too many pixels") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError):
        raise MediaError("undecodable", f"the image cannot be read as {kind.upper()}") from None


def rgb(image: Image.Image) -> Image.Image:
    """`image` in RGB, any transparency laid on white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, BACKGROUND)
        flat.paste(rgba, mask=rgba.split()[3])
        return flat
    return image.convert("RGB")
