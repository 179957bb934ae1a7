"""Images sent inline, as `data:` URIs (chat's and the Responses API's `image_url`) or as bare
base64 (the Messages API's `source.data`)."""

from __future__ import annotations

import binascii

from sluicegate.errors import MediaError

CHUNK = 1 << 20
"""Characters of base64 decoded at a time: each piece is one short C call, so a thread doing
it lets the event loop take the GIL back between pieces."""

_WHITESPACE = str.maketrans("", "", " \t\r\n")


def split(uri: str) -> tuple[str, str]:
    """A `data:` URI's media type and base64 payload; `MediaError` if it is not a base64
    image URI (`data:image/...;base64,...`)."""
    head, comma, payload = uri.partition(",")
    if not comma or not head[:5].lower() == "data:":
        raise MediaError("bad_data_uri", "a data: URI has the form data:image/png;base64,...")
    params = head[5:].split(";")
    media_type = params[0].strip().lower()
    if "base64" not in (p.strip().lower() for p in params[1:]):
        raise MediaError("bad_data_uri", "an image's data: URI is base64 (;base64,)")
    if media_type and not media_type.startswith("image/"):
        raise MediaError("bad_data_uri", f"a data: URI of type {media_type!r} is not an image")
    return media_type, payload


def decoded_size(payload: str) -> int:
    """The most bytes `payload` can decode to (its line breaks and spaces counted as base64)."""
    return len(payload) * 3 // 4


def decode(payload: str, max_bytes: int) -> bytes:
    """`payload`'s bytes (line breaks and spaces allowed, as MIME's base64 has them), in
    pieces (`CHUNK`); `MediaError` if it is not base64 or decodes past `max_bytes`. Run it in
    a thread when the payload is large."""
    # Before decoding, with room for line breaks (MIME's: one in 77 characters); after, exact.
    if decoded_size(payload) > max_bytes + max_bytes // 32 + 4:
        raise MediaError("too_large", f"the image is larger than {max_bytes} bytes")
    pieces: list[bytes] = []
    carry = ""
    padded = False
    for start in range(0, len(payload), CHUNK):
        text = carry + payload[start : start + CHUNK].translate(_WHITESPACE)
        usable = len(text) - len(text) % 4
        carry = text[usable:]
        if not usable:
            continue
        if padded:  # padding ended the data already
            raise MediaError("bad_data_uri", "the image's base64 is not valid (its padding)")
        try:
            pieces.append(binascii.a2b_base64(text[:usable], strict_mode=True))
        except ValueError:  # binascii.Error, or a character outside ASCII
            raise MediaError("bad_data_uri", "the image's base64 is not valid") from None
        padded = text[usable - 1] == "="
    if carry:
        raise MediaError("bad_data_uri", "the image's base64 is not valid (its length)")
    data = b"".join(pieces)
    if len(data) > max_bytes:
        raise MediaError("too_large", f"the image is larger than {max_bytes} bytes")
    return data
