"""The LoRA adapters loaded into the in-process vLLM engine, by name.

An adapter is copied into a snapshot the gateway owns (`lora_snapshots`), checked there
(`lora.read_adapter`), and vLLM is given the snapshot, before any request names it: vLLM would
otherwise load it lazily inside a model step, where a failure kills the engine, and it reads
an adapter it has evicted from memory again from its path, inside a model step too (the
snapshot is still what was checked, whatever became of the folder it came from). Unloading
takes the name away at once; vLLM drops the weights once the requests running on it have
finished (vLLM itself would reload an adapter removed under a running request from its path at
the next step), and then its snapshot goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluicegate.engine.lora import AdapterError, AdapterInfo, BaseModel, read_adapter
from sluicegate.engine.lora_snapshots import Snapshots
from sluicegate.errors import InvalidRequestError, ModelNotFoundError, NotFoundError

logger = logging.getLogger(__name__)

_UTILITY_FAILED = re.compile(r"^Call to \w+ method failed: ")
_WORKER_FAILED = re.compile(r"^Worker failed with error '(.*)', please check", re.DOTALL)


@dataclass(slots=True)
class _Loaded:
    request: Any
    """vLLM's `LoRARequest`."""
    path: str
    """The folder it was loaded from (vLLM reads `request.lora_path`, its snapshot)."""
    fingerprint: str
    running: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class LoadedAdapters:
    """Name -> vLLM `LoRARequest` for an `AsyncLLM` built with LoRA on."""

    def __init__(
        self, llm: Any, max_rank: int, base: BaseModel, snapshots: Snapshots | None = None
    ) -> None:
        self._llm = llm
        self._max_rank = max_rank
        self._base = base
        self._snapshots = snapshots or Snapshots()
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

    async def load(self, name: str, path: str, roots: Sequence[str] | None = None) -> None:
        """Snapshot, check and load the adapter at `path` as `name`; `InvalidRequestError`
        (400) says why it cannot be. `roots`: the folders `path` must be inside, symlinks
        resolved (None: anywhere, for the operator's own `LORA_MODULES`)."""
        from vllm.lora.request import LoRARequest

        async with self._lock:  # one name, one load: two at once would both pass the check
            if name in self._loaded:
                raise InvalidRequestError(
                    f"The adapter {name!r} is already loaded.", param="lora_name"
                )
            lora_id = next(self._ids)
            # The thread runs on if the load is cancelled: whatever it makes is dropped then.
            prepared = asyncio.ensure_future(asyncio.to_thread(self._prepare, path, lora_id, roots))
            try:
                snapshot, info = await asyncio.shield(prepared)
            except AdapterError as exc:
                raise InvalidRequestError(str(exc), param="lora_path") from None
            except OSError as exc:  # the adapter's files changed while they were read
                raise InvalidRequestError(
                    f"lora_path {path} cannot be read: {exc.strerror or exc}", param="lora_path"
                ) from None
            except BaseException:
                self._in_background(self._abandon(prepared, None))
                raise
            request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=snapshot)
            try:
                await self._llm.add_lora(request)
            except Exception as exc:
                await asyncio.shield(self._in_background(self._abandon(prepared, None)))
                raise InvalidRequestError(
                    f"vLLM refused the adapter: {_engine_message(exc)}", param="lora_path"
                ) from None
            except BaseException:  # cancelled: vLLM may have taken it meanwhile
                self._in_background(self._abandon(prepared, lora_id))
                raise
            self._loaded[name] = _Loaded(request, path, info.fingerprint)
        logger.info("LoRA adapter %s loaded from %s", name, path)

    async def _abandon(
        self, prepared: asyncio.Future[tuple[str, AdapterInfo]], added: int | None
    ) -> None:
        """Undo a load that did not finish: the adapter out of vLLM (`added`: its id, when
        vLLM may hold it), then its snapshot, once the thread making it has ended."""
        if added is not None:
            with contextlib.suppress(Exception):
                await self._llm.remove_lora(added)
        with contextlib.suppress(BaseException):
            snapshot, _ = await prepared
            await asyncio.to_thread(self._snapshots.drop, snapshot)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` as a task that a cancellation of its caller does not stop (`close` does)."""
        task = asyncio.create_task(work)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    def _prepare(
        self, path: str, lora_id: int, roots: Sequence[str] | None
    ) -> tuple[str, AdapterInfo]:
        """The adapter's snapshot, and what it is: the snapshot is what is checked."""
        snapshot = self._snapshots.take(path, str(lora_id), roots)
        try:
            return snapshot, read_adapter(snapshot, self._max_rank, self._base, shown=path)
        except BaseException:
            self._snapshots.drop(snapshot)
            raise

    def unload(self, name: str) -> None:
        """Take `name` away now (it may be loaded again at once); its weights go once the
        requests running on it end."""
        loaded = self._loaded.pop(name, None)
        if loaded is None:
            raise NotFoundError(f"The adapter {name!r} is not loaded.", param="lora_name")
        self._in_background(self._retire(name, loaded))

    async def _retire(self, name: str, loaded: _Loaded) -> None:
        if loaded.running:
            await loaded.idle.wait()
        try:
            await self._llm.remove_lora(loaded.request.lora_int_id)
        except Exception as exc:  # the engine is gone, or stopping: nothing left to free
            logger.warning("LoRA adapter %s not removed from the engine: %s", name, exc)
        else:
            logger.info("LoRA adapter %s unloaded", name)
        # No request names its id any more: vLLM will not read the snapshot again.
        await asyncio.to_thread(self._snapshots.drop, loaded.request.lora_path)

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
        """Once the engine has stopped: no more unloading, and the snapshots go."""
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await asyncio.to_thread(self._snapshots.close)


def _engine_message(exc: BaseException) -> str:
    """vLLM's message without the wrapping of its utility call and worker process."""
    text = _UTILITY_FAILED.sub("", str(exc).strip())
    if (worker := _WORKER_FAILED.match(text)) is not None:
        text = worker.group(1)
    return text.splitlines()[0][:500] if text else type(exc).__name__
