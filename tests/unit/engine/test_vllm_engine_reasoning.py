"""The vLLM adapter with a reasoning parser: what it tells vLLM's engine (against a stand-in
that records its calls; the real engine runs in tests/integration/reasoning/)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sluicegate.engine.protocol import Prompt, ReasoningOptions, SamplingOptions
from sluicegate.engine.vllm_engine import EngineConfig, VLLMEngine, engine_arguments
from tests.support.recording_llm import RecordingLLM


class ClosingParser:
    """A parser for which a prompt holding id 15 has closed the thoughts (as `step3`)."""

    name = "fake"

    def prompt_ends_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        return 15 in prompt_ids


async def run(engine: VLLMEngine, prompt: list[int], options: SamplingOptions) -> list[Any]:
    steps = engine.generate("r", Prompt(prompt), options, arrival_time=1.0)
    return [step async for step in steps]


def engine_with(llm: RecordingLLM, parser: Any = None) -> VLLMEngine:
    return VLLMEngine(llm, None, 64, reasoning_parser=parser)  # type: ignore[arg-type]


def test_the_engine_core_gets_the_parser() -> None:
    config = EngineConfig(model="m", served_model_name="m", reasoning_parser="step3")
    assert engine_arguments(config, on_gpu=False)["reasoning_parser"] == "step3"
    plain = EngineConfig(model="m", served_model_name="m")
    assert "reasoning_parser" not in engine_arguments(plain, on_gpu=False)
    plugged = EngineConfig(
        model="m", served_model_name="m", reasoning_parser="mine", reasoning_parser_plugin="/p.py"
    )
    arguments = engine_arguments(plugged, on_gpu=False)
    assert (arguments["reasoning_parser"], arguments["reasoning_parser_plugin"]) == (
        "mine",
        "/p.py",
    )
    assert "reasoning_parser_plugin" not in engine_arguments(config, on_gpu=False)


async def test_deltas_carry_their_token_ids_only_for_a_parser() -> None:
    llm = RecordingLLM("Hi.", (7, 8), "stop")
    steps = await run(engine_with(llm, ClosingParser()), [1, 2], SamplingOptions(max_tokens=2))
    assert steps[0].choices[0].token_ids == [7, 8]
    steps = await run(engine_with(llm), [1, 2], SamplingOptions(max_tokens=2))
    assert steps[0].choices[0].token_ids is None


@pytest.mark.parametrize(
    ("prompt", "reasoning", "expected"),
    [
        # A chat that set no reasoning field, or a completion: the core reads the prompt.
        ([1, 2], None, {}),
        # Thoughts open at the end of the prompt: the grammar waits for their end.
        (
            [1, 2],
            ReasoningOptions(template_kwargs='{"enable_thinking": true}'),
            {
                "reasoning_ended": False,
                "reasoning_parser_kwargs": {"chat_template_kwargs": {"enable_thinking": True}},
            },
        ),
        # The template closed them (thinking off): constrained from the first token.
        (
            [1, 15, 2],
            ReasoningOptions(effort="none"),
            {
                "reasoning_ended": True,
                "reasoning_parser_kwargs": {
                    "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "none"}
                },
            },
        ),
        # Thoughts left out of the answer: vLLM's server constrains from the start too.
        (
            [1, 2],
            ReasoningOptions(include=False),
            {"reasoning_ended": True, "reasoning_parser_kwargs": {"chat_template_kwargs": {}}},
        ),
    ],
)
async def test_the_reasoning_state_goes_to_vllm_as_its_server_sends_it(
    prompt: list[int], reasoning: ReasoningOptions | None, expected: dict[str, Any]
) -> None:
    llm = RecordingLLM("Hi.", (7, 8), "stop")
    options = SamplingOptions(max_tokens=2, reasoning=reasoning)
    await run(engine_with(llm, ClosingParser()), prompt, options)
    assert llm.extra == [expected]


async def test_no_parser_sends_no_reasoning_state() -> None:
    llm = RecordingLLM("Hi.", (7, 8), "stop")
    options = SamplingOptions(max_tokens=2, reasoning=ReasoningOptions(include=False))
    await run(engine_with(llm), [1, 15], options)
    assert llm.extra == [{}]


async def test_the_thinking_budget_goes_into_the_sampling_params() -> None:
    llm = RecordingLLM("Hi.", (7, 8), "stop")
    options = SamplingOptions(max_tokens=2, reasoning=ReasoningOptions(budget=3))
    await run(engine_with(llm, ClosingParser()), [1], options)
    assert llm.params[0].thinking_token_budget == 3


class RefusingLLM(RecordingLLM):
    """Refuses as vLLM's input processor does a budget without a reasoning parser."""

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        from vllm.exceptions import VLLMValidationError

        raise VLLMValidationError(
            "thinking_token_budget is set but reasoning_config is not configured."
        )
        yield  # pragma: no cover


async def test_a_refused_budget_names_its_field() -> None:
    from sluicegate.errors import InvalidRequestError

    options = SamplingOptions(max_tokens=2, reasoning=ReasoningOptions(budget=3))
    with pytest.raises(InvalidRequestError) as refused:
        await run(engine_with(RefusingLLM()), [1], options)
    assert refused.value.param == "thinking_token_budget"
