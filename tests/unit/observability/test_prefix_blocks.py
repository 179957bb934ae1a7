"""Prompts as numbered prefix blocks: chained, keyed, numbered in first-seen order."""

from __future__ import annotations

import pytest

from sluicegate.observability.prefix_blocks import PrefixBlocks


def numbered(blocks: PrefixBlocks, ids: list[int]) -> list[int]:
    return blocks.numbers(blocks.digests(ids))


def test_only_full_blocks_are_numbered() -> None:
    blocks = PrefixBlocks(block_size=4)
    assert numbered(blocks, list(range(11))) == [1, 2]
    assert numbered(blocks, [1, 2, 3]) == []


def test_prompts_share_numbers_as_far_as_they_share_their_prefix() -> None:
    blocks = PrefixBlocks(block_size=4)
    first = numbered(blocks, [*range(8), 50, 51, 52, 53])
    second = numbered(blocks, [*range(8), 60, 61, 62, 63, *range(4)])
    assert first == [1, 2, 3]
    assert second == [1, 2, 4, 5]


def test_a_block_is_numbered_by_its_whole_prefix_not_its_own_tokens() -> None:
    blocks = PrefixBlocks(block_size=2)
    assert numbered(blocks, [7, 7, 7, 7]) == [1, 2]
    assert numbered(blocks, [9, 9, 7, 7]) == [3, 4]


def test_two_keys_number_the_same_prompts_alike_with_other_digests() -> None:
    one, two = PrefixBlocks(block_size=2), PrefixBlocks(block_size=2)
    prompts = [[1, 2, 3, 4], [1, 2, 5, 6], [8, 8]]
    assert [numbered(one, p) for p in prompts] == [numbered(two, p) for p in prompts]
    assert one.digests([1, 2]) != two.digests([1, 2])


def test_past_what_it_remembers_a_block_gets_a_fresh_number_each_time() -> None:
    blocks = PrefixBlocks(block_size=1, remembered=2)
    assert numbered(blocks, [1, 2]) == [1, 2]
    assert numbered(blocks, [5]) == [3]
    assert numbered(blocks, [5]) == [4]
    assert numbered(blocks, [1, 2]) == [1, 2]
    assert blocks.remembered == 2


def test_once_forgotten_the_key_and_digests_are_gone() -> None:
    blocks = PrefixBlocks(block_size=2)
    numbered(blocks, [1, 2, 3, 4])
    blocks.forget()
    assert not blocks.keyed and blocks.remembered == 0
    with pytest.raises(RuntimeError, match="closed"):
        blocks.digests([1, 2])
