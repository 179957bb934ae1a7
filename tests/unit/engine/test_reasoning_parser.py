"""Our adapter over vLLM's reasoning parsers (the real `step3` and `deepseek_r1`), on the
tokenizer of the reasoning variant of the bundled model (`tests.support.reasoning_model`, no
weights): its split, token by token or in larger deltas, joins to what vLLM's own whole-text
parse gives, and its pieces are those vLLM's chat server streams."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate.engine.reasoning_parser import (
    ReasoningParserError,
    VLLMReasoningParser,
    reasoning_parser_names,
)
from tests.support.reasoning_model import reasoning_tokenizer

OUTPUTS = {
    "step3": [
        "The user asks about France. Its capital is Paris.</think>The capital is Paris.",
        "Thinking, never ending",
        "Short.</think>",
        "</think>All answer.",
    ],
    "deepseek_r1": [
        "<think>The user asks about France.</think>The capital is Paris.",
        "The prompt opened it. Paris.</think>Paris.",
        "Thinking, never ending",
    ],
    # An engine-based parser (vLLM's declarative parser engine behind it).
    "qwen3": [
        "<think>The user asks about France.</think>The capital is Paris.",
        "The prompt opened it. Paris.</think>Paris.",
    ],
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from vllm.tokenizers import get_tokenizer

    folder = tmp_path_factory.mktemp("reasoning-tokenizers")
    step3 = reasoning_tokenizer(folder / "step3")
    r1 = reasoning_tokenizer(folder / "deepseek_r1", with_start=True)
    both = get_tokenizer(str(r1))
    return {"step3": get_tokenizer(str(step3)), "deepseek_r1": both, "qwen3": both}


def cases() -> Iterator[tuple[str, str]]:
    for name, outputs in OUTPUTS.items():
        for output in outputs:
            yield name, output


def _vllm_parser(name: str, tokenizer: Any) -> Any:
    """vLLM's parser for one choice, as its chat server makes it."""
    from vllm.parser import ParserManager

    cls = ParserManager.get_parser(reasoning_parser_name=name, tokenizer=tokenizer)
    assert cls is not None
    return cls(tokenizer, None, chat_template_kwargs={})


def _vllm_request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "m", "messages": []})


def _pieces(tokenizer: Any, text: str, size: int) -> list[tuple[str, list[int]]]:
    """The text as deltas of `size` tokens, each with its text as vLLM detokenizes it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    pieces, before = [], ""
    for end in range(1, len(chunks) + 1):
        so_far = tokenizer.decode([t for c in chunks[:end] for t in c])
        pieces.append((so_far[len(before) :], chunks[end - 1]))
        before = so_far
    return pieces


PROMPT = [1, 9690, 198]  # "<|im_start|>system\n": no marker in it


@pytest.mark.parametrize(("name", "output"), list(cases()))
def test_a_token_at_a_time_streams_as_vllms_server(
    tokenizers: dict[str, Any], name: str, output: str
) -> None:
    tokenizer = tokenizers[name]
    ours = VLLMReasoningParser(name, tokenizer).stream(PROMPT, {})
    theirs = _vllm_parser(name, tokenizer)
    request = _vllm_request()
    pieces = _pieces(tokenizer, output, 1)
    ids: list[int] = []
    for i, (text, delta_ids) in enumerate(pieces):
        last = i == len(pieces) - 1
        ids += delta_ids
        got = ours.feed(text, delta_ids, last)
        expected = theirs.parse_delta(text, delta_ids, request, PROMPT, finished=last)
        want = ("", "") if expected is None else (expected.reasoning or "", expected.content or "")
        assert got == want, (i, text)
    assert ours.count() == theirs.count_reasoning_tokens(ids)


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize(("name", "output"), list(cases()))
def test_deltas_of_any_size_join_to_vllms_whole_parse(
    tokenizers: dict[str, Any], name: str, output: str, size: int
) -> None:
    """Deltas of several tokens (an engine's outputs merged, an upstream's events read
    together) split as a token at a time does, and join to vLLM's parse of the whole text
    (its unstreamed answer). vLLM's own stream keeps `<think>` in the thoughts when a delta
    holds more than it; ours feeds each marker alone."""
    tokenizer = tokenizers[name]
    request = _vllm_request()
    pieces = _pieces(tokenizer, output, size)
    ids = [t for _, d in pieces for t in d]
    reasoning, content, _ = _vllm_parser(name, tokenizer).parse(
        tokenizer.decode(ids), request, model_output_token_ids=ids
    )
    for encodes_text in (False, True):
        streamed = VLLMReasoningParser(name, tokenizer, encodes_text=encodes_text).stream(
            PROMPT, {}
        )
        joined = [
            streamed.feed(t, () if encodes_text else d, i == len(pieces) - 1)
            for i, (t, d) in enumerate(pieces)
        ]
        assert "".join(r for r, _ in joined) == (reasoning or ""), encodes_text
        assert "".join(c for _, c in joined) == (content or ""), encodes_text
        assert streamed.count() == _vllm_parser(name, tokenizer).count_reasoning_tokens(ids)


def test_a_marker_the_text_left_out_feeds_the_delta_whole(tokenizers: dict[str, Any]) -> None:
    """A delta whose ids hold a marker its text lacks (a special token the detokenizer
    skipped) goes to the parser whole, as vLLM's server would send it: the split is vLLM's."""
    tokenizer = tokenizers["deepseek_r1"]
    ours = VLLMReasoningParser("deepseek_r1", tokenizer).stream(PROMPT, {})
    theirs = _vllm_parser("deepseek_r1", tokenizer)
    words = tokenizer.encode(" Hmm. Paris", add_special_tokens=False)
    for text, ids, last in [
        ("Hmm.", [14, *words[:2]], False),
        (" Paris", [15, *words[2:]], True),
    ]:
        expected = theirs.parse_delta(text, ids, _vllm_request(), PROMPT, finished=last)
        assert ours.feed(text, ids, last) == (expected.reasoning or "", expected.content or "")


def test_step3_counts_the_tokens_before_the_end_of_thoughts(tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers["step3"]
    stream = VLLMReasoningParser("step3", tokenizer).stream(PROMPT, {})
    thought = tokenizer.encode("Paris, surely.", add_special_tokens=False)
    answer = tokenizer.encode("</think>Paris.", add_special_tokens=False)
    stream.feed(tokenizer.decode(thought), thought, False)
    assert stream.feed(tokenizer.decode(answer), answer, True) == ("", "Paris.")
    assert stream.count() == len(thought)


def test_a_prompt_that_closed_the_thoughts_makes_all_content(tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers["step3"]
    parser = VLLMReasoningParser("step3", tokenizer)
    closed = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert parser.prompt_ends_reasoning(closed)
    assert not parser.prompt_ends_reasoning(PROMPT)
    stream = parser.stream(closed, {"enable_thinking": False})
    ids = tokenizer.encode("Paris. It is.", add_special_tokens=False)
    assert stream.feed(tokenizer.decode(ids), ids, True) == ("", "Paris. It is.")


def test_an_unknown_name_is_refused_with_the_known_ones(tokenizers: dict[str, Any]) -> None:
    with pytest.raises(ReasoningParserError) as refused:
        VLLMReasoningParser("no_such_parser", tokenizers["step3"])
    message = str(refused.value)
    assert "'no_such_parser'" in message
    assert all(name in message for name in ("deepseek_r1", "qwen3", "step3"))
    assert "step3" in reasoning_parser_names()


def test_a_tokenizer_without_the_markers_is_refused(tmp_path: Path) -> None:
    from vllm.tokenizers import get_tokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    plain = get_tokenizer(str(bundled_model_dir(Settings().model_cache_dir)))
    with pytest.raises(ReasoningParserError, match="step3"):
        VLLMReasoningParser("step3", plain)


class _Failing:
    """A vLLM parser whose streaming breaks after `good` deltas, and whose counting too."""

    def __init__(self, inner: Any, good: int):
        self._inner = inner
        self._good = good

    def parse_delta(self, *args: Any, **kwargs: Any) -> Any:
        if self._good <= 0:
            raise RuntimeError("parser bug")
        self._good -= 1
        return self._inner.parse_delta(*args, **kwargs)

    def count_reasoning_tokens(self, ids: Any) -> int:
        raise RuntimeError("parser bug")


def test_a_failing_parser_ends_the_split_not_the_answer(
    tokenizers: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = tokenizers["step3"]
    stream = VLLMReasoningParser("step3", tokenizer).stream(PROMPT, {})
    stream._parser = _Failing(stream._parser, good=1)  # type: ignore[attr-defined]
    assert stream.feed("Hmm", [44], False) == ("Hmm", "")
    assert stream.feed(" well", [1], False) == ("", " well")
    assert stream.feed("</think>Paris", [15, 2], True) == ("", "</think>Paris")
    assert stream.count() == 0
    failures = [r for r in caplog.records if "step3" in r.getMessage()]
    assert len(failures) == 2  # once for the split, once for the count


@pytest.mark.parametrize(("name", "output"), list(cases()))
def test_text_alone_splits_as_its_tokens_do(
    tokenizers: dict[str, Any], name: str, output: str
) -> None:
    """An upstream's deltas come as text: with `encodes_text`, their ids are the tokenizer's
    encoding of it, and the split is the one the engine's ids give (one token a delta, as
    vLLM's server streams)."""
    tokenizer = tokenizers[name]
    pieces = _pieces(tokenizer, output, 1)
    with_ids = VLLMReasoningParser(name, tokenizer).stream(PROMPT, {})
    text_only = VLLMReasoningParser(name, tokenizer, encodes_text=True).stream(PROMPT, {})
    for i, (text, ids) in enumerate(pieces):
        last = i == len(pieces) - 1
        assert text_only.feed(text, (), last) == with_ids.feed(text, ids, last), (i, text)
    assert text_only.count() == with_ids.count()


def test_text_alone_is_not_split_without_encodes_text(tokenizers: dict[str, Any]) -> None:
    """The control: deepseek_r1 finds its end marker by id, so text without ids stays
    thoughts."""
    stream = VLLMReasoningParser("deepseek_r1", tokenizers["deepseek_r1"]).stream(PROMPT, {})
    stream.feed("Hmm.", (), False)
    assert stream.feed("</think>", (), False) == ("</think>", "")


PLUGIN = '''
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser


@ReasoningParserManager.register_module("{name}")
class Plugged(DeepSeekR1ReasoningParser):
    """deepseek_r1's split, under a name of the plugin's own."""
'''


def test_a_plugin_file_adds_parsers_by_name(tokenizers: dict[str, Any], tmp_path: Path) -> None:
    name = f"plugged_{tmp_path.name}"
    plugin = tmp_path / "parsers.py"
    plugin.write_text(PLUGIN.format(name=name))
    with pytest.raises(ReasoningParserError, match="unknown reasoning parser"):
        VLLMReasoningParser(name, tokenizers["deepseek_r1"])
    parser = VLLMReasoningParser(name, tokenizers["deepseek_r1"], plugin=str(plugin))
    stream = parser.stream(PROMPT, {})
    pieces = _pieces(tokenizers["deepseek_r1"], "<think>Hmm.</think>Paris.", 1)
    split = [stream.feed(t, ids, i == len(pieces) - 1) for i, (t, ids) in enumerate(pieces)]
    assert ("".join(r for r, _ in split), "".join(c for _, c in split)) == ("Hmm.", "Paris.")


def test_a_plugin_that_fails_to_load_is_named(tmp_path: Path) -> None:
    from sluicegate.engine.reasoning_parser import load_reasoning_plugin

    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no')\n")
    with pytest.raises(ReasoningParserError, match=r"broken\.py failed to load: RuntimeError"):
        load_reasoning_plugin(str(broken))
    with pytest.raises(ReasoningParserError, match="is no file"):
        load_reasoning_plugin(str(tmp_path / "absent.py"))
