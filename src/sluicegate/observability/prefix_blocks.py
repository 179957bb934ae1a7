"""A prompt's prefix as numbered blocks: how the traffic capture (`observability.capture`)
says which requests share which prefix, without a token id leaving the process.

Each full block of `BLOCK_SIZE` token ids is fed to one keyed BLAKE2b, and its digest taken
after each block: the digest of block i covers blocks 0 to i, as vLLM's prefix cache keys its
KV blocks, so two prompts have equal digests exactly as far as they share their whole prefix.
The key is random per capture and forgotten when it closes (`forget`): nobody can test the
digests against guessed prompts. Digests are renumbered 1, 2, ... in the order they are first
seen, and only the numbers are written, so two captures of the same traffic number it alike.

A partial last block is no block: the prefix cache holds full blocks only. The numbering
remembers `MAX_REMEMBERED` digests; past them, a new digest gets a fresh number without being
remembered, and its later repeats are taken for new blocks.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Sequence

from sluicegate.observability.traffic_format import BLOCK_SIZE

KEY_BYTES = 32
DIGEST_BYTES = 16
MAX_REMEMBERED = 1_000_000
"""Digests the numbering remembers: about 130 MB when full (a 16-byte digest, its number and
the dict's slot for them, measured)."""
_ID = "q"
"""Each token id as 8 bytes: ids of any vocabulary fit."""


class PrefixBlocks:
    """Numbers a capture's prompts' blocks. Not thread-safe: one capture's writer thread
    owns it."""

    def __init__(
        self,
        key: bytes | None = None,
        block_size: int = BLOCK_SIZE,
        remembered: int = MAX_REMEMBERED,
    ) -> None:
        self._key: bytes | None = key if key is not None else os.urandom(KEY_BYTES)
        self._block_bytes = block_size * array(_ID).itemsize
        self._remembered = remembered
        self._numbers: dict[bytes, int] = {}
        self._next = 1

    @property
    def keyed(self) -> bool:
        """Whether the key is still held (until `forget`)."""
        return self._key is not None

    @property
    def remembered(self) -> int:
        """Digests the numbering holds."""
        return len(self._numbers)

    def digests(self, ids: Sequence[int]) -> list[bytes]:
        """The chained digests of the full blocks of `ids`, first to last."""
        if self._key is None:
            raise RuntimeError("the capture is closed: its key is forgotten")
        data = memoryview(array(_ID, ids).tobytes())
        size = self._block_bytes
        chain = hashlib.blake2b(key=self._key, digest_size=DIGEST_BYTES)
        found: list[bytes] = []
        for start in range(0, len(data) - size + 1, size):
            chain.update(data[start : start + size])
            found.append(chain.copy().digest())
        return found

    def numbers(self, digests: Sequence[bytes]) -> list[int]:
        """Each digest's number: the one it was first given, or the next."""
        return [self._number(digest) for digest in digests]

    def forget(self) -> None:
        """Drop the key and every digest: nothing left can be tied to a prompt."""
        self._key = None
        self._numbers.clear()

    def _number(self, digest: bytes) -> int:
        number = self._numbers.get(digest)
        if number is None:
            number = self._next
            self._next += 1
            if len(self._numbers) < self._remembered:
                self._numbers[digest] = number
        return number
