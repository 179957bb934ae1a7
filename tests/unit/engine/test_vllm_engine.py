"""The vLLM adapter's hand-off to `AsyncLLM`, against a stand-in that records its calls.

The stand-in is not vLLM: it only captures what the adapter passes. The real engine runs in
the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from sluicegate.engine.protocol import Prompt, SamplingOptions
from sluicegate.engine.vllm_engine import VLLMEngine
from tests.support.recording_llm import RecordingLLM


async def test_the_prompt_goes_as_token_ids_with_the_gateways_arrival_time() -> None:
    llm = RecordingLLM()
    engine = VLLMEngine(llm, tokenizer=None, max_model_len=64)  # type: ignore[arg-type]
    options = SamplingOptions(max_tokens=1, temperature=0.0)
    steps = [
        step
        async for step in engine.generate("req-1", Prompt([1, 2, 3]), options, arrival_time=123.5)
    ]
    assert [c.text for c in steps[0].choices] == ["Hi"] and steps[0].finished
    prompt, params, request_id = llm.calls[0]
    assert request_id == "req-1"
    assert prompt["prompt_token_ids"] == [1, 2, 3]
    # vLLM's engine reads this as the request's arrival: its TTFT and e2e latency count from
    # it, as they do behind vLLM's server, which stamps it before rendering the prompt.
    assert prompt["arrival_time"] == 123.5
    assert (params.max_tokens, params.temperature) == (1, 0.0)
    # Fresh for this request: vLLM's input processor takes it as it is, without a deep copy.
    assert params.skip_clone


async def test_the_priority_goes_to_vllm() -> None:
    llm = RecordingLLM()
    engine = VLLMEngine(llm, tokenizer=None, max_model_len=64)  # type: ignore[arg-type]
    options = SamplingOptions(max_tokens=1)
    for priority in (0, 3):
        steps = engine.generate("req", Prompt([1]), options, arrival_time=1.0, priority=priority)
        assert [step.finished async for step in steps] == [True]
    assert llm.priorities == [0, 3]


def test_vllm_takes_a_priority_per_request() -> None:
    """The stand-in above mirrors vLLM's own signature: `AsyncLLM.generate(..., priority=)`."""
    import inspect

    from vllm.v1.engine.async_llm import AsyncLLM

    parameter = inspect.signature(AsyncLLM.generate).parameters["priority"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default == 0


def test_structured_outputs_run_on_xgrammar_with_the_whitespace_setting() -> None:
    from sluicegate.engine.vllm_engine import EngineConfig, engine_arguments

    for compact in (True, False):
        config = EngineConfig(
            model="m", served_model_name="m", structured_compact_whitespace=compact
        )
        assert engine_arguments(config, on_gpu=False)["structured_outputs_config"] == {
            "backend": "xgrammar",
            "disable_any_whitespace": compact,
        }


def test_the_parallel_layout_goes_to_vllm_as_given() -> None:
    from sluicegate.engine.vllm_engine import EngineConfig, engine_arguments

    default = engine_arguments(EngineConfig(model="m", served_model_name="m"), on_gpu=False)
    assert (default["data_parallel_size"], default["distributed_executor_backend"]) == (1, None)
    config = EngineConfig(
        model="m",
        served_model_name="m",
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        data_parallel_size=2,
        distributed_executor_backend="ray",
    )
    arguments = engine_arguments(config, on_gpu=True)
    assert arguments["tensor_parallel_size"] == 8 and arguments["pipeline_parallel_size"] == 2
    assert arguments["data_parallel_size"] == 2
    assert arguments["distributed_executor_backend"] == "ray"


def test_vllm_takes_the_parallel_layout_as_engine_arguments() -> None:
    """The names above are fields of vLLM's own `AsyncEngineArgs`."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    assert {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "distributed_executor_backend",
    } <= fields


def test_xgrammar_messages_lose_their_native_source_location() -> None:
    from sluicegate.engine.vllm_engine import _first_line

    message = (
        "Failed to transform regex into a grammar: [11:00:12] /project/cpp/regex_converter.cc:83:"
        " Regex parsing error at position 3: Unclosed '['\n\nmore"
    )
    assert _first_line(message) == (
        "Failed to transform regex into a grammar: Regex parsing error at position 3: Unclosed '['"
    )
    assert _first_line("The JSON schema is nested too deeply") == (
        "The JSON schema is nested too deeply"
    )


async def test_the_structured_check_is_vllms_own_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`check_structured` runs vLLM's `SamplingParams.verify` with the engine's configs."""
    from vllm.config import StructuredOutputsConfig

    from sluicegate.engine.protocol import StructuredOutput
    from sluicegate.errors import InvalidRequestError

    seen: list[Any] = []

    class Verifying(RecordingLLM):
        model_config = SimpleNamespace()
        vllm_config = SimpleNamespace(
            speculative_config=None,
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
        )
        tokenizer = object()

    engine = VLLMEngine(Verifying(), tokenizer=None, max_model_len=64)  # type: ignore[arg-type]
    import vllm.sampling_params as sampling

    def verify(self: Any, model_config: Any, spec: Any, so_config: Any, tok: Any) -> None:
        seen.append((so_config.backend, self.structured_outputs.regex))
        if self.structured_outputs.regex == "a[":
            raise sampling.VLLMValidationError("Failed to transform regex into a grammar: bad")

    monkeypatch.setattr(sampling.SamplingParams, "verify", verify)
    await engine.check_structured(StructuredOutput(regex="ab"))
    with pytest.raises(InvalidRequestError) as caught:
        await engine.check_structured(StructuredOutput(regex="a["))
    assert caught.value.message == "Failed to transform regex into a grammar: bad"
    assert seen == [("xgrammar", "ab"), ("xgrammar", "a[")]


class PromptScoringLLM:
    """Sends a prompt's logprobs in two parts, as vLLM may for a prompt prefilled in chunks."""

    errored = False

    def __init__(self) -> None:
        self.params: Any = None

    async def generate(
        self,
        prompt: Any,
        params: Any,
        request_id: str,
        *,
        priority: int = 0,
        lora_request: Any = None,
    ) -> AsyncIterator[Any]:
        self.params = params

        def position(token_id: int, logprob: float) -> dict[int, Any]:
            sampled = SimpleNamespace(logprob=logprob, rank=2, decoded_token=f"t{token_id}")
            best = SimpleNamespace(logprob=-0.1, rank=1, decoded_token="best")
            return {token_id: sampled, 99: best}

        ids = [5, 6, 7]
        parts = [[None, position(6, -1.0)], [position(7, float("-inf"))]]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            output = SimpleNamespace(
                index=0, text="!" if last else "", token_ids=[1] if last else [],
                finish_reason="length" if last else None, logprobs=None,
            )  # fmt: skip
            yield SimpleNamespace(
                outputs=[output], prompt_token_ids=ids, prompt_logprobs=part, finished=last,
                metrics=None,
            )  # fmt: skip


async def test_prompt_logprobs_and_logit_bias_go_through_in_order() -> None:
    llm = PromptScoringLLM()
    engine = VLLMEngine(llm, tokenizer=None, max_model_len=64)  # type: ignore[arg-type]
    options = SamplingOptions(max_tokens=1, prompt_logprobs=1, logit_bias=((3, -100.0),))
    steps = [
        step async for step in engine.generate("r", Prompt([5, 6, 7]), options, arrival_time=1.0)
    ]
    assert (llm.params.prompt_logprobs, llm.params.logit_bias) == (1, {3: -100.0})
    scored = [entry for step in steps for entry in step.prompt_logprobs or []]
    assert scored[0] is None
    assert [(e.token, e.logprob, e.top) for e in scored[1:] if e is not None] == [
        ("t6", -1.0, (("best", -0.1),)),
        ("t7", -9999.0, (("best", -0.1),)),
    ]


def test_the_engines_own_times_come_once_it_has_a_first_token() -> None:
    from sluicegate.engine.vllm_engine import _MONOTONIC_TO_PERF, _engine_times

    waiting = SimpleNamespace(queued_ts=10.0, scheduled_ts=0.0, first_token_ts=0.0)
    assert _engine_times(waiting) is None
    started = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.25)
    times = _engine_times(started)
    assert times is not None
    assert (times.queued, times.scheduled, times.first_token) == (
        10.0 + _MONOTONIC_TO_PERF,
        10.5 + _MONOTONIC_TO_PERF,
        11.25 + _MONOTONIC_TO_PERF,
    )


def test_the_scheduler_settings_reach_vllms_own_engine_arguments() -> None:
    """MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS and LONG_PREFILL_TOKEN_THRESHOLD (what `sluicegate
    tune` searches) go to vLLM under its own names."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    from sluicegate.engine.vllm_engine import engine_arguments
    from sluicegate.settings import Settings
    from sluicegate.wiring.engines import engine_config

    settings = Settings(
        max_num_seqs=16, max_num_batched_tokens=512, long_prefill_token_threshold=128
    )
    arguments = engine_arguments(engine_config(settings, "m"), on_gpu=False)
    names = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")
    assert [arguments[name] for name in names] == [16, 512, 128]
    assert set(names) <= {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    default = engine_arguments(engine_config(Settings(), "m"), on_gpu=False)
    assert default["long_prefill_token_threshold"] == 0
