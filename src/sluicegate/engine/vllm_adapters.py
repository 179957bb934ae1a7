"""The LoRA adapters loaded into the in-process vLLM engine, by name.

An adapter is checked (`lora.read_adapter`) before vLLM is asked to load it, and loaded before
any request names it: vLLM would otherwise load it lazily inside a model step, where a failure
kills the engine. Unloading takes the name away at once; vLLM drops the weights once the
requests running on it have finished (vLLM itself would reload an adapter removed under a
running request from its path at the next step).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sluicegate.engine.lora import AdapterError, BaseModel, read_adapter
from sluicegate.errors import InvalidRequestError, ModelNotFoundError, NotFoundError

logger = logging.getLogger(__name__)

_UTILITY_FAILED = re.compile(r"^Call to \w+ method failed: ")
_WORKER_FAILED = re.compile(r"^Worker failed with error '(.*)', please check", re.DOTALL)


@dataclass(slots=True)
class _Loaded:
    request: Any
    """vLLM's `LoRARequest`."""
    path: str
    fingerprint: str
    running: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class LoadedAdapters:
    """Name -> vLLM `LoRARequest` for an `AsyncLLM` built with LoRA on."""

    def __init__(self, llm: Any, max_rank: int, base: BaseModel) -> None:
        self._llm = llm
        self._max_rank = max_rank
        self._base = base
        self._loaded: dict[str, _Loaded] = {}
        # vLLM wants ids unique for an adapter's life: one is never given twice.
        self._ids = itertools.count(1)
        self._retiring: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    def names(self) -> list[str]:
        return list(self._loaded)

    def identity(self, name: str) -> str:
        """What the adapter's answers depend on: its path and its files (`AdapterInfo`)."""
        loaded = self._loaded[name]
        return f"{loaded.path}@{loaded.fingerprint}"

    async def load(self, name: str, path: str) -> None:
        """Check and load the adapter at `path` as `name`; `InvalidRequestError` (400) says why
        it cannot be."""
        from vllm.lora.request import LoRARequest

        async with self._lock:  # one name, one load: two at once would both pass the check
            if name in self._loaded:
                raise InvalidRequestError(
                    f"The adapter {name!r} is already loaded.", param="lora_name"
                )
            try:
                info = await asyncio.to_thread(read_adapter, path, self._max_rank, self._base)
            except AdapterError as exc:
                raise InvalidRequestError(str(exc), param="lora_path") from None
            request = LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=path)
            try:
                await self._llm.add_lora(request)
            except Exception as exc:
                raise InvalidRequestError(
                    f"vLLM refused the adapter: {_engine_message(exc)}", param="lora_path"
                ) from None
            self._loaded[name] = _Loaded(request, path, info.fingerprint)
        logger.info("LoRA adapter %s loaded from %s", name, path)

    def unload(self, name: str) -> None:
        """Take `name` away now (it may be loaded again at once); its weights go once the
        requests running on it end."""
        loaded = self._loaded.pop(name, None)
        if loaded is None:
            raise NotFoundError(f"The adapter {name!r} is not loaded.", param="lora_name")
        task = asyncio.create_task(self._retire(name, loaded))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, name: str, loaded: _Loaded) -> None:
        if loaded.running:
            await loaded.idle.wait()
        try:
            await self._llm.remove_lora(loaded.request.lora_int_id)
        except Exception as exc:  # the engine is gone, or stopping: nothing left to free
            logger.warning("LoRA adapter %s not removed from the engine: %s", name, exc)
            return
        logger.info("LoRA adapter %s unloaded", name)

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[Any]:
        """The adapter's `LoRARequest` for one request, held until the request ends."""
        loaded = self._loaded.get(name)
        if loaded is None:
            # The registry routed here just before an unload took the name.
            raise ModelNotFoundError(f"The model `{name}` does not exist.", param="model")
        loaded.running += 1
        loaded.idle.clear()
        try:
            yield loaded.request
        finally:
            loaded.running -= 1
            if not loaded.running:
                loaded.idle.set()

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)


def _engine_message(exc: BaseException) -> str:
    """vLLM's message without the wrapping of its utility call and worker process."""
    text = _UTILITY_FAILED.sub("", str(exc).strip())
    if (worker := _WORKER_FAILED.match(text)) is not None:
        text = worker.group(1)
    return text.splitlines()[0][:500] if text else type(exc).__name__
