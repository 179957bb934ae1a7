"""Token ids for a profile's requests: each numbered block becomes the same ids wherever it
appears (so requests share prefixes where the traffic did), drawn from the model's vocabulary
without its special ids, from a salt (a new one for every trial, so that no trial starts with
the last one's prompts in the prefix cache: requests' own tokens are seeded by their place in
the window, which repeats). The traffic's own tokens were never captured."""

from __future__ import annotations

import random
from collections.abc import Sequence

from sluicegate.tuning.profile import Request


class PromptMaker:
    def __init__(self, vocabulary: Sequence[int], block_size: int, salt: int = 0) -> None:
        if not vocabulary:
            raise ValueError("an empty vocabulary")
        self._vocabulary = list(vocabulary)
        self._block_size = block_size
        self._salt = salt
        self._blocks: dict[int, list[int]] = {}

    def ids(self, request: Request, index: int) -> list[int]:
        """`request.input_tokens` ids: its blocks' ids, then ids of its own (`index`: its
        place in the profile) for what its blocks do not cover."""
        ids: list[int] = []
        for block in request.blocks:
            ids += self._block(block)
        if len(ids) < request.input_tokens:
            rng = random.Random(f"{self._salt}:own:{index}")
            ids += rng.choices(self._vocabulary, k=request.input_tokens - len(ids))
        return ids[: request.input_tokens]

    def _block(self, block: int) -> list[int]:
        made = self._blocks.get(block)
        if made is None:
            rng = random.Random(f"{self._salt}:block:{block}")
            made = self._blocks[block] = rng.choices(self._vocabulary, k=self._block_size)
        return made
