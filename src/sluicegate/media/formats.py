"""The image formats the gateway takes, known by their first bytes (a server's or a data
URI's content type is not trusted: it only has to agree that the thing is an image)."""

from __future__ import annotations

from typing import Literal

ImageFormat = Literal["png", "jpeg", "gif", "webp"]
"""What OpenAI's and Anthropic's APIs take, and Pillow opens without plugins of its own."""

PILLOW_NAMES: dict[ImageFormat, str] = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP"}
MEDIA_TYPES: dict[ImageFormat, str] = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}

SNIFF_BYTES = 12
"""How many leading bytes `sniff` needs."""


def sniff(head: bytes) -> ImageFormat | None:
    """The format whose signature `head` starts with, or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    return None
