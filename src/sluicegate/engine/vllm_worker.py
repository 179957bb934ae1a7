"""vLLM's worker, ending at its first exit handler once vLLM's teardown is over.

A stopped worker process (`WorkerProc.worker_main` shuts its worker down, then returns)
spent seconds more in the interpreter's own teardown of torch and the model, and the engine
core waited for it: past the gateway's grace on a loaded machine, so the core was killed.
vLLM picks its worker class per platform (`parallel_config.worker_cls`, a qualified name
resolved in the worker process), so the class here is made from whatever it picked: the
executor (`vllm_process`) names `stopping_worker_name(picked)`, and this module's
`__getattr__` builds, in the worker process, a subclass of the picked class whose `shutdown`
asks for that exit (`child_process.exit_after_teardown`).

Importing this module imports nothing of vLLM: the base class is imported by name.
"""

from __future__ import annotations

import importlib
from typing import Any

from sluicegate.child_process import exit_after_teardown

PREFIX = "Stopping:"
"""A made class's name: the prefix, then the picked class's qualified name with ':' for '.'
(vLLM splits a qualified name at its last dot)."""

_made: dict[str, type[Any]] = {}


def stopping_worker_name(picked: str) -> str:
    """The qualified name vLLM resolves to the stopping subclass of the class `picked`."""
    return f"{__name__}.{PREFIX}{picked.replace('.', ':')}"


def stopping_worker(base: type[Any]) -> type[Any]:
    """A subclass of vLLM's worker class `base` whose `shutdown` ends the process after it."""

    def shutdown(self: Any) -> None:
        base.shutdown(self)
        exit_after_teardown(returning=True)

    return type(f"Stopping{base.__name__}", (base,), {"shutdown": shutdown, "__module__": __name__})


def __getattr__(name: str) -> type[Any]:
    if not name.startswith(PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        module, _, cls = name.removeprefix(PREFIX).replace(":", ".").rpartition(".")
        _made[name] = stopping_worker(getattr(importlib.import_module(module), cls))
    return _made[name]
