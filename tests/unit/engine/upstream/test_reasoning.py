"""`engine.upstream.reasoning`: a pool's own reasoning parser (vLLM's, over the pool's local
tokenizer) for upstreams that send their thoughts inside the content; refused at start-up,
in one line, where it cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.engine.upstream.discovery import UpstreamStartError
from sluicegate.engine.upstream.reasoning import gateway_reasoning_parser
from tests.support.reasoning_model import reasoning_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HFPromptTokenizer:
    from transformers import AutoTokenizer

    folder = reasoning_tokenizer(tmp_path_factory.mktemp("r1"), with_start=True)
    return HFPromptTokenizer(AutoTokenizer.from_pretrained(str(folder)))


def test_the_pool_splits_text_deltas_with_its_tokenizer(tokenizer: HFPromptTokenizer) -> None:
    parser = gateway_reasoning_parser("deepseek_r1", tokenizer)
    stream = parser.stream([], {})
    pieces = ["<think>", "Two", " and", " two", ".", "</think>", "Four", "."]
    split = [stream.feed(text, (), i == len(pieces) - 1) for i, text in enumerate(pieces)]
    assert "".join(r for r, _ in split) == "Two and two."
    assert "".join(c for _, c in split) == "Four."
    assert stream.count() == 4


def test_without_the_models_own_tokenizer_it_is_refused() -> None:
    with pytest.raises(UpstreamStartError, match="needs the model's own tokenizer"):
        gateway_reasoning_parser("deepseek_r1", None)


def test_an_unknown_parser_is_refused_naming_the_known_ones(
    tokenizer: HFPromptTokenizer,
) -> None:
    with pytest.raises(UpstreamStartError, match=r"unknown reasoning parser 'nope'.*qwen3"):
        gateway_reasoning_parser("nope", tokenizer)


def test_a_tokenizer_without_the_markers_is_refused(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    plain = AutoTokenizer.from_pretrained(str(bundled_model_dir(Settings().model_cache_dir)))
    with pytest.raises(UpstreamStartError, match="cannot be used with this model"):
        gateway_reasoning_parser("deepseek_r1", HFPromptTokenizer(plain))
