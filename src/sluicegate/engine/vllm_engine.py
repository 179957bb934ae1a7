"""The engine adapter over vLLM's V1 `AsyncLLM` (what `AsyncLLMEngine` names).

It is built inside the app lifespan, in the running event loop, the way vLLM's own OpenAI
server builds it, and it is the one place where vLLM's exceptions become the gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicegate.engine.lora import BaseModel
from sluicegate.engine.protocol import (
    ChoiceDelta,
    EngineLoad,
    EngineStep,
    EngineTimes,
    FinishReason,
    Prompt,
    PromptImage,
    ReasoningOptions,
    ReasoningParser,
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
    ToolCallParser,
)
from sluicegate.engine.reasoning_parser import VLLMReasoningParser, check_reasoning_parser
from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.engine.tool_parser import VLLMToolCallParser
from sluicegate.engine.vllm_adapters import LoadedAdapters
from sluicegate.engine.vllm_images import VLLMImages, image_template
from sluicegate.errors import EngineUnavailableError, InvalidRequestError

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from sluicegate.engine.vllm_core import CoreClient
    from sluicegate.engine.vllm_load import LoadMeter

logger = logging.getLogger(__name__)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - vLLM always brings torch
        return False
    return bool(torch.cuda.is_available())


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the engine is built from (the engine settings, see `wiring.engine_config`)."""

    model: str
    """The resolved folder or hub id (`engine.model.resolve_model`)."""
    served_model_name: str
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    """`mp`, `ray`, or None for vLLM's choice."""
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    """At most this many of a prompt's tokens a step (0: no bound of its own)."""
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    enforce_eager: bool | None = None
    cpu_kvcache_space_gib: int | None = None
    structured_compact_whitespace: bool = True
    """JSON grammars allow no free whitespace (vLLM applies this engine-wide: its xgrammar
    backend ignores the per-request flag)."""
    chat_template: str | None = None
    """Jinja text replacing the model's chat template."""
    tool_call_parser: str | None = None
    """vLLM's name of the tool parser for `tool_choice` auto."""
    reasoning_parser: str | None = None
    """vLLM's name of the reasoning parser that splits thoughts from the answer (the
    gateway's split, `engine.reasoning_parser`); the engine core gets it too, so that
    structured outputs constrain the answer only, and `thinking_token_budget` works."""
    reasoning_parser_plugin: str | None = None
    """A Python file registering more reasoning parsers with vLLM (its
    `--reasoning-parser-plugin`), loaded here and in the engine core."""
    lora: LoraConfig | None = None
    """LoRA adapters on (vLLM's `enable_lora`), with these bounds; None: off."""
    max_images: int = 8
    """Images one prompt may hold (vLLM's `limit_mm_per_prompt`; a model that reads none
    ignores it)."""


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """vLLM's LoRA bounds (`max_loras`, `max_lora_rank`, `max_cpu_loras`)."""

    max_loras: int = 1
    """Adapters one batch may hold at once."""
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    """Adapters kept loaded in memory (vLLM's default: `max_loras`)."""


def engine_arguments(config: EngineConfig, on_gpu: bool) -> dict[str, Any]:
    """Keyword arguments for vLLM's `AsyncEngineArgs`."""
    dtype = config.dtype
    if dtype == "auto" and not on_gpu:
        # CPUs without native bf16 run float32 several times faster (docs/operations.md).
        dtype = "float32"
    enforce_eager = config.enforce_eager if config.enforce_eager is not None else not on_gpu
    args: dict[str, Any] = {
        "model": config.model,
        "served_model_name": config.served_model_name,
        "tokenizer": config.model,
        "revision": config.revision,
        "trust_remote_code": config.trust_remote_code,
        "dtype": dtype,
        "max_model_len": config.max_model_len,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "distributed_executor_backend": config.distributed_executor_backend,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        "enable_prefix_caching": config.enable_prefix_caching,
        "limit_mm_per_prompt": {"image": config.max_images},
        "scheduling_policy": config.scheduling_policy,
        "enforce_eager": enforce_eager,
        "disable_log_stats": False,
        "enable_log_requests": False,
        # xgrammar alone, never vLLM's `auto` fallback to guidance or outlines: what xgrammar
        # refuses is a 400 (see `VLLMEngine.check_structured`), and the engine core, which
        # picks one backend for its whole life from the first constrained request, always
        # gets xgrammar. It is also the backend on which compact whitespace works.
        "structured_outputs_config": {
            "backend": "xgrammar",
            "disable_any_whitespace": config.structured_compact_whitespace,
        },
    }
    if config.reasoning_parser is not None:
        args["reasoning_parser"] = config.reasoning_parser
        if config.reasoning_parser_plugin is not None:
            args["reasoning_parser_plugin"] = config.reasoning_parser_plugin
    if on_gpu:
        args["gpu_memory_utilization"] = config.gpu_memory_utilization
    if config.lora is not None:
        args.update(
            enable_lora=True,
            max_loras=config.lora.max_loras,
            max_lora_rank=config.lora.max_lora_rank,
            max_cpu_loras=config.lora.max_cpu_loras,
        )
    return args


def engine_vllm_config(config: EngineConfig, clients: int = 1, rank: int = 0) -> Any:
    """vLLM's configuration of the engine, as its server makes it. With `clients` front-end
    processes over one core (`SLUICEGATE_WORKERS`): the supervisor's (`rank` -1, which
    launches the core) and each worker's (its own `rank`) are made the same way."""
    if config.cpu_kvcache_space_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_space_gib)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    arguments = engine_arguments(config, cuda_available())
    arguments["structured_outputs_config"] = StructuredOutputsConfig(
        **arguments["structured_outputs_config"]
    )
    engine_args = AsyncEngineArgs(**arguments)
    if clients > 1:
        engine_args._api_process_count = clients
        engine_args._api_process_rank = rank
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


class VLLMEngine:
    """`EngineClient` over an in-process `AsyncLLM` whose core runs in a child process."""

    def __init__(
        self,
        llm: AsyncLLM,
        tokenizer: HFPromptTokenizer,
        max_model_len: int,
        tool_parser: ToolCallParser | None = None,
        meter: LoadMeter | None = None,
        adapters: LoadedAdapters | None = None,
        reasoning_parser: VLLMReasoningParser | None = None,
    ):
        self._llm = llm
        self._reasoning_parser = reasoning_parser
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._tool_parser = tool_parser
        self._meter = meter
        self.adapters = adapters
        """The LoRA adapters loaded, when LoRA is on (`EngineConfig.lora`)."""
        # (Unit tests build the engine over stand-ins that have no tokenizer.)
        reads_images = getattr(tokenizer, "images", None) is not None
        self._images = VLLMImages(llm, tokenizer) if reads_images else None

    @classmethod
    async def start(
        cls, config: EngineConfig, core: CoreClient | None = None, meter: LoadMeter | None = None
    ) -> VLLMEngine:
        """Start the engine, its core in a child process; or, with `core`, become one of the
        clients of a core the supervisor started (`SLUICEGATE_WORKERS`), reading the
        engine's load from `meter` (which every worker's shares)."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from sluicegate.engine.vllm_load import LoadMeter
        from sluicegate.engine.vllm_process import executor_class

        if config.reasoning_parser is not None:
            # Before minutes of start-up.
            check_reasoning_parser(config.reasoning_parser, config.reasoning_parser_plugin)
        count, index = (1, 0) if core is None else (core.count, core.index)
        vllm_config = engine_vllm_config(config, clients=count, rank=index)
        meter = meter or LoadMeter(cores=config.data_parallel_size)
        # As `AsyncLLM.from_vllm_config` builds it, with an executor that takes the engine
        # core out of the gateway's process group (see `vllm_process`).
        llm = AsyncLLM(
            vllm_config=vllm_config,
            executor_class=executor_class(vllm_config),
            usage_context=UsageContext.OPENAI_API_SERVER,
            # Beside vLLM's own loggers (its Prometheus metrics stay as they are).
            stat_loggers=[meter.logger],
            log_requests=False,
            log_stats=True,
            **({} if core is None else core.client_arguments()),
        )
        try:
            hf_tokenizer = llm.get_tokenizer()
            images = image_template(
                llm, vllm_config.model_config, config.chat_template, config.max_images
            )
            tokenizer = HFPromptTokenizer(
                hf_tokenizer, chat_template=config.chat_template, images=images
            )
            parser = None
            if config.tool_call_parser is not None:
                parser = VLLMToolCallParser(config.tool_call_parser, hf_tokenizer)
            reasoning = None
            if config.reasoning_parser is not None:
                reasoning = VLLMReasoningParser(
                    config.reasoning_parser,
                    hf_tokenizer,
                    vllm_config.model_config,
                    plugin=config.reasoning_parser_plugin,
                )
            adapters = None
            if config.lora is not None:
                base = _base_model(config, vllm_config.model_config.hf_config)
                adapters = LoadedAdapters(llm, config.lora.max_lora_rank, base)
        except BaseException:
            llm.shutdown()
            raise
        max_len = vllm_config.model_config.max_model_len
        return cls(llm, tokenizer, max_len, parser, meter, adapters, reasoning)

    @property
    def tokenizer(self) -> HFPromptTokenizer:
        return self._tokenizer

    @property
    def tool_parser(self) -> ToolCallParser | None:
        return self._tool_parser

    @property
    def reasoning_parser(self) -> ReasoningParser | None:
        return self._reasoning_parser

    @property
    def renders_chat(self) -> bool:
        return False

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def takes_images(self) -> bool:
        return self._images is not None

    async def image_tokens(self, images: Sequence[PromptImage]) -> tuple[list[int], bool]:
        if self._images is None:
            return [0] * len(images), True
        return await self._images.extra_tokens(images), True

    def generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        if adapter is None:
            return self._generate(request_id, prompt, options, arrival_time, priority, None)
        return self._generate_with(adapter, request_id, prompt, options, arrival_time, priority)

    async def _generate_with(
        self,
        adapter: str,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        arrival_time: float,
        priority: int,
    ) -> AsyncGenerator[EngineStep, None]:
        """`_generate` with a LoRA adapter, held for the request's whole run."""
        if self.adapters is None:
            raise InvalidRequestError("LoRA adapters are not enabled.", param="model")
        with self.adapters.using(adapter) as lora:
            steps = self._generate(request_id, prompt, options, arrival_time, priority, lora)
            async with contextlib.aclosing(steps):
                async for step in steps:
                    yield step

    async def _generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        arrival_time: float,
        priority: int,
        lora: Any,
    ) -> AsyncGenerator[EngineStep, None]:
        from vllm.exceptions import VLLMValidationError
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._llm.errored:
            raise EngineUnavailableError()
        try:
            params = _sampling_params(options)
            if prompt.images and self._images is not None:
                # Its processor expands each placeholder, right before the request goes in
                # (its cache assumes what it processed reaches the core).
                given: Any = await self._images.processed(prompt, arrival_time)
            else:
                given = tokens_input(prompt.ids)
            # vLLM's server stamps the arrival before it renders and tokenizes; so do we, or
            # `vllm:time_to_first_token_seconds` would leave out the gateway's share.
            given["arrival_time"] = arrival_time
            # `priority` only orders the queue under SCHEDULING_POLICY=priority; it is 0
            # otherwise (see `quota.share`).
            stream = self._llm.generate(
                given,
                params,
                request_id,
                priority=priority,
                lora_request=lora,
                **self._reasoning_arguments(prompt, options),
            )
            # aclosing: leaving early (disconnect, cancellation) closes vLLM's generator,
            # which aborts the request in the engine core.
            with_ids = self._reasoning_parser is not None
            scored = 0  # prompt positions whose logprobs were passed on (they come in parts)
            timed = False
            # Counted among the engine's unfinished requests (by every worker) until it ends.
            meter = self._meter
            if meter is not None:
                meter.started()
            try:
                async with contextlib.aclosing(stream):
                    async for output in stream:
                        times = None
                        if not timed and (stats := output.metrics) is not None:
                            times = _engine_times(stats)
                            timed = times is not None
                        prompt_ids = output.prompt_token_ids or ()
                        prompt_logprobs = None
                        if options.prompt_logprobs is not None and output.prompt_logprobs:
                            prompt_logprobs = _prompt_logprobs(
                                prompt_ids[scored:], output.prompt_logprobs, options.prompt_logprobs
                            )
                            scored += len(prompt_logprobs)
                        yield EngineStep(
                            choices=[
                                _choice_delta(c, options.logprobs, with_ids) for c in output.outputs
                            ],
                            prompt_tokens=len(prompt_ids),
                            finished=output.finished,
                            prompt_logprobs=prompt_logprobs,
                            times=times,
                        )
            finally:
                if meter is not None:
                    meter.finished()
        except EngineDeadError as exc:
            raise EngineUnavailableError() from exc
        except VLLMValidationError as exc:
            message = str(exc.args[0])
            raise InvalidRequestError(message, param=exc.parameter or _param(message)) from exc
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        except Exception as exc:
            if self._llm.errored:
                raise EngineUnavailableError() from exc
            raise

    def _reasoning_arguments(self, prompt: Prompt, options: SamplingOptions) -> dict[str, Any]:
        """What vLLM's chat server tells the engine core of a chat's reasoning: whether the
        thoughts are over before the first token (`include_reasoning` false: the answer
        alone is constrained, from the start; a prompt that closed them), and the template's
        arguments for the core's own parser. Nothing for a completion, or a chat that set no
        reasoning field: the core then asks its parser about the prompt, to the same end."""
        parser = self._reasoning_parser
        reasoning = options.reasoning
        if parser is None or reasoning is None:
            return {}
        ended = not reasoning.include or parser.prompt_ends_reasoning(prompt.ids)
        return {
            "reasoning_ended": ended,
            "reasoning_parser_kwargs": {"chat_template_kwargs": reasoning.kwargs()},
        }

    async def check_structured(self, structured: StructuredOutput) -> None:
        """vLLM's own validation of the constraint (`SamplingParams.verify`, which its input
        processor runs on every request: nesting, emptiness, and xgrammar parsing the schema,
        regex or grammar), run here in a worker thread so that a refusal is known, and named,
        before the request is admitted. xgrammar's parsers release the GIL."""
        await asyncio.to_thread(self._verify_structured, structured)

    def _verify_structured(self, structured: StructuredOutput) -> None:
        from vllm.exceptions import VLLMValidationError

        llm = self._llm
        try:
            params = _sampling_params(SamplingOptions(max_tokens=1, structured=structured))
            params.verify(
                llm.model_config,
                llm.vllm_config.speculative_config,
                llm.vllm_config.structured_outputs_config,
                llm.tokenizer,
            )
        except VLLMValidationError as exc:
            raise InvalidRequestError(_first_line(str(exc.args[0]))) from exc
        except (ValueError, RuntimeError) as exc:
            # xgrammar's parse errors are RuntimeErrors ("[time] file.cc:83: Regex parsing
            # error at position 3: ..."); a NUL in a regex is a ValueError.
            raise InvalidRequestError(_first_line(str(exc))) from exc

    def load(self) -> EngineLoad | None:
        if self._meter is None:
            return None
        load = self._meter.load()
        # The last step's stats outlive it, and requests handed to the engine since then are
        # in none; the count of unfinished requests (every worker's) is exact at once. With
        # none left, nothing waits or runs (a stale count could otherwise refuse every
        # request of an idle engine forever); those not in the last step's batch are waiting.
        unfinished = self._meter.unfinished
        if unfinished <= 0:
            return EngineLoad(0, 0, 0.0, load.step_seconds)
        waiting = max(load.waiting, unfinished - load.running)
        return dataclasses.replace(load, waiting=waiting)

    def abandon(self) -> None:
        """The engine core is gone (the supervisor saw it die, `SLUICEGATE_WORKERS`): close
        this client as vLLM's own core monitor does, which ends every request waiting on it
        with vLLM's engine-dead error, and marks the engine errored for the health check."""
        self._llm.engine_core.shutdown()

    async def check_health(self) -> None:
        if self._llm.errored:
            raise EngineUnavailableError()
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise EngineUnavailableError() from exc

    async def shutdown(self) -> None:
        self._tokenizer.close()
        self._llm.shutdown()
        # After the engine: it may read an adapter's snapshot until it stops.
        if self.adapters is not None:
            await self.adapters.close()


def _base_model(config: EngineConfig, hf_config: Any) -> BaseModel:
    """What adapters are checked against: the model's names and its layers' sizes."""
    names = {config.served_model_name, Path(config.model.rstrip("/")).name}
    named = getattr(hf_config, "_name_or_path", "") or ""
    if named:
        names.add(named.rstrip("/").rsplit("/", 1)[-1])
    return BaseModel.of(names, hf_config.to_dict())


def _sampling_params(options: SamplingOptions) -> Any:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    # SamplingOptions uses vLLM's names on purpose; only these change shape.
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    fields.update(
        stop=list(options.stop) or None,
        logit_bias=dict(options.logit_bias) or None,
        structured_outputs=_structured_outputs(fields.pop("structured")),
    )
    del fields["max_tokens_given"]  # the budget always gives this engine its max_tokens
    del fields["pass_through"]  # its output is tokens, rendered by the gateway
    reasoning: ReasoningOptions | None = fields.pop("reasoning")
    if reasoning is not None and reasoning.budget is not None:
        fields["thinking_token_budget"] = reasoning.budget
    return SamplingParams(
        **fields,
        output_kind=RequestOutputKind.DELTA,
        # Made afresh for each request, so vLLM's input processor need not deep-copy it on
        # the event loop (as vLLM's server tells it too).
        skip_clone=True,
    )


def _structured_outputs(structured: StructuredOutput | None) -> Any:
    if structured is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(
        json=structured.json,
        json_object=structured.json_object or None,
        regex=structured.regex,
        choice=None if structured.choice is None else list(structured.choice),
        grammar=structured.grammar,
        disable_any_whitespace=structured.compact_whitespace,
    )


def _first_line(message: str) -> str:
    """An xgrammar message without its source location and trailing lines."""
    line = message.strip().splitlines()[0] if message.strip() else message
    marker = line.find(".cc:")
    if marker >= 0:
        rest = line[marker:].split(": ", 1)
        line = (
            line[: line.rfind("[", 0, marker)].rstrip() + " " + (rest[1] if len(rest) > 1 else "")
        )
    return line.strip()[:500]


_MONOTONIC_TO_PERF = time.perf_counter() - time.monotonic()
"""vLLM's engine core stamps with `time.monotonic()` (CLOCK_MONOTONIC, shared by the
processes of a host); the gateway's timeline uses `time.perf_counter()` (the same clock on
Linux, where this is about 0)."""


def _engine_times(stats: Any) -> EngineTimes | None:
    """The engine's times from vLLM's request stats, once it has produced a first token."""
    first = stats.first_token_ts
    if not first or not stats.scheduled_ts:
        return None
    return EngineTimes(
        queued=(stats.queued_ts or stats.scheduled_ts) + _MONOTONIC_TO_PERF,
        scheduled=stats.scheduled_ts + _MONOTONIC_TO_PERF,
        first_token=first + _MONOTONIC_TO_PERF,
    )


def _param(message: str) -> str | None:
    """The request field a refusal of vLLM's names when it does not say (its thinking budget
    without a reasoning parser)."""
    return "thinking_token_budget" if "thinking_token_budget" in message else None


def _choice_delta(output: Any, top_k: int | None, with_ids: bool = False) -> ChoiceDelta:
    """`with_ids`: the delta keeps its token ids (for the gateway's reasoning parser)."""
    finish: FinishReason | None = output.finish_reason
    logprobs = None
    if output.logprobs is not None:
        logprobs = [
            _token_logprob(token_id, position, top_k or 0)
            for token_id, position in zip(output.token_ids, output.logprobs, strict=False)
        ]
    # vLLM's `stop_reason`: the stop string that matched, a stop token id, or None.
    reason = getattr(output, "stop_reason", None)
    stop = reason if isinstance(reason, str) else None
    return ChoiceDelta(
        index=output.index,
        text=output.text,
        num_tokens=len(output.token_ids),
        finish_reason=finish,
        logprobs=logprobs,
        stop_sequence=stop,
        token_ids=list(output.token_ids) if with_ids else None,
    )


def _prompt_logprobs(
    token_ids: Sequence[int], positions: Sequence[Any], top_k: int
) -> list[TokenLogprob | None]:
    """vLLM's prompt logprobs: None for the first prompt token, which nothing predicts."""
    return [
        None if position is None else _token_logprob(token_id, position, top_k)
        for token_id, position in zip(token_ids, positions, strict=False)
    ]


# JSON has no -inf; OpenAI-compatible servers report impossible tokens as -9999.
_MIN_LOGPROB = -9999.0


def _token_logprob(token_id: int, position: Any, top_k: int) -> TokenLogprob:
    sampled = position[token_id]
    ranked = sorted(
        (lp.rank, lp.decoded_token or "", max(lp.logprob, _MIN_LOGPROB))
        for lp in position.values()
        if lp.rank is not None and 1 <= lp.rank <= top_k
    )
    return TokenLogprob(
        token=sampled.decoded_token or "",
        logprob=max(sampled.logprob, _MIN_LOGPROB),
        top=tuple((token, logprob) for _, token, logprob in ranked),
    )
