"""An in-process vLLM engine that embeds: vLLM's pooling runner (`runner="pooling"`, with
`convert="embed"` for a generative checkpoint), beside the generative engine.

Built as `VLLMEngine` is (in the running event loop, its core in a child process out of the
gateway's process group), with its own share of memory: on GPU its own
`gpu_memory_utilization`, on CPU its own KV space (a pooling model keeps no cache across
requests, only the batch's). Its statistics are not exported: a second vLLM stat logger in one
process would take the first engine's `vllm:*` series away (vLLM unregisters them when its
logger starts); the gateway's own embedding series count it instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluicegate.engine.protocol import Embedding, EngineLoad, Prompt
from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.errors import EngineUnavailableError, InvalidRequestError

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from sluicegate.engine.vllm_core import CoreClient


@dataclass(frozen=True, slots=True)
class EmbeddingConfig:
    model: str
    """The resolved folder or hub id."""
    served_model_name: str
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    max_model_len: int = 2048
    convert: bool = True
    """`convert="embed"`: a generative checkpoint pooled as an embedding model (vLLM leaves
    a checkpoint that is one already as it is)."""
    gpu_memory_utilization: float = 0.2
    cpu_kvcache_space_gib: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enforce_eager: bool | None = None


def embedding_arguments(config: EmbeddingConfig, on_gpu: bool) -> dict[str, Any]:
    dtype = config.dtype
    if dtype == "auto" and not on_gpu:
        dtype = "float32"
    args: dict[str, Any] = {
        "model": config.model,
        "served_model_name": config.served_model_name,
        "tokenizer": config.model,
        "revision": config.revision,
        "trust_remote_code": config.trust_remote_code,
        "dtype": dtype,
        "max_model_len": config.max_model_len,
        "runner": "pooling",
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": max(config.max_num_batched_tokens, config.max_model_len),
        "enforce_eager": config.enforce_eager if config.enforce_eager is not None else not on_gpu,
        "disable_log_stats": True,
        "enable_log_requests": False,
    }
    if config.convert:
        args["convert"] = "embed"
    if on_gpu:
        args["gpu_memory_utilization"] = config.gpu_memory_utilization
    return args


def embedding_vllm_config(config: EmbeddingConfig, clients: int = 1, rank: int = 0) -> Any:
    """vLLM's configuration of the pooling engine (see `vllm_engine.engine_vllm_config`)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from sluicegate.engine.vllm_engine import cuda_available

    # Read when the configuration is made, below, before any await: the other engine's
    # start cannot change it in between.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_space_gib)
    engine_args = AsyncEngineArgs(**embedding_arguments(config, cuda_available()))
    if clients > 1:
        engine_args._api_process_count = clients
        engine_args._api_process_rank = rank
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


class VLLMEmbedder:
    """`EmbeddingEngine` over an in-process `AsyncLLM` running vLLM's pooling runner."""

    def __init__(self, llm: AsyncLLM, tokenizer: HFPromptTokenizer, max_model_len: int):
        self._llm = llm
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._checked: dict[int, str | None] = {}

    @classmethod
    async def start(cls, config: EmbeddingConfig, core: CoreClient | None = None) -> VLLMEmbedder:
        """Start the engine, its core in a child process; or, with `core`, become one of the
        clients of a core the supervisor started (`SLUICEGATE_WORKERS`)."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from sluicegate.engine.vllm_process import executor_class

        count, index = (1, 0) if core is None else (core.count, core.index)
        vllm_config = embedding_vllm_config(config, clients=count, rank=index)
        llm = AsyncLLM(
            vllm_config=vllm_config,
            executor_class=executor_class(vllm_config),
            usage_context=UsageContext.OPENAI_API_SERVER,
            log_requests=False,
            log_stats=False,
            **({} if core is None else core.client_arguments()),
        )
        try:
            tokenizer = HFPromptTokenizer(llm.get_tokenizer())
        except BaseException:
            llm.shutdown()
            raise
        return cls(llm, tokenizer, vllm_config.model_config.max_model_len)

    @property
    def tokenizer(self) -> HFPromptTokenizer:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        if self._llm.errored:
            raise EngineUnavailableError()
        if dimensions is not None:
            await self.check_dimensions(dimensions)
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._one(f"{request_id}-{i}", prompt, dimensions))
                for i, prompt in enumerate(prompts)
            ]
        return [task.result() for task in tasks]

    async def _one(self, request_id: str, prompt: Prompt, dimensions: int | None) -> Embedding:
        from vllm.inputs import tokens_input
        from vllm.pooling_params import PoolingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        # `task="embed"`: left unset, vLLM picks per-token embeddings for a model that
        # supports both.
        params = PoolingParams(task="embed", dimensions=dimensions)
        last: Any = None
        try:
            async for output in self._llm.encode(tokens_input(prompt.ids), params, request_id):
                last = output
        except EngineDeadError as exc:
            raise EngineUnavailableError() from exc
        except ValueError as exc:
            raise InvalidRequestError(str(exc).splitlines()[0], param="input") from exc
        except Exception as exc:
            if self._llm.errored:
                raise EngineUnavailableError() from exc
            raise
        if last is None or getattr(last, "error", None) is not None:
            raise EngineUnavailableError("The embedding engine failed the request.")
        vector: list[float] = last.outputs.data.tolist()
        return Embedding(vector, len(last.prompt_token_ids or prompt.ids))

    async def check_dimensions(self, dimensions: int) -> None:
        """vLLM's own check of `dimensions` (Matryoshka models only, within their size),
        once per value."""
        if dimensions not in self._checked:
            self._checked[dimensions] = await asyncio.to_thread(self._verify, dimensions)
        refusal = self._checked[dimensions]
        if refusal is not None:
            raise InvalidRequestError(refusal, param="dimensions")

    def _verify(self, dimensions: int) -> str | None:
        from vllm.pooling_params import PoolingParams

        params = PoolingParams(task="embed", dimensions=dimensions)
        try:
            params.verify(self._llm.model_config)
        except ValueError as exc:
            return str(exc).splitlines()[0]
        return None

    def load(self) -> EngineLoad | None:
        return None

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
