"""The pass-through gate and reasoning: a plain chat stream is its upstream's own events only
when the gateway has nothing to do to its thoughts."""

from __future__ import annotations

from sluicegate.engine.protocol import Prompt, SamplingOptions
from sluicegate.inference.run import Run
from sluicegate.wire.formats import ResponseFormat, chat_format, completion_format


def _run(fmt: ResponseFormat) -> Run:
    return Run("r", [Prompt([1, 2])], SamplingOptions(max_tokens=4), fmt, 0.0)


def test_a_plain_chat_passes_through_with_its_thoughts() -> None:
    assert _run(chat_format("m", False)).plain_stream()
    assert _run(completion_format("m", False)).plain_stream()


def test_a_chat_whose_thoughts_the_gateway_splits_is_rendered() -> None:
    # The engine has a reasoning parser: its output is not yet the client's wire.
    assert not _run(chat_format("m", False, reasons=True)).plain_stream()


def test_a_chat_without_its_thoughts_is_rendered() -> None:
    # The upstream may not know `include_reasoning`: the rendered path drops the thoughts.
    assert not _run(chat_format("m", False, include_reasoning=False)).plain_stream()
