"""LoRA adapters for the in-process engine: how they are named, and what is checked before
vLLM is asked to load one.

`SLUICEGATE_LORA_MODULES` takes the forms vLLM's `--lora-modules` takes: `name=path` pairs
(comma-separated here), or JSON: one object or a list of objects with `name`, `path` and
optionally `base_model_name`.

vLLM checks little itself before loading: a missing folder is only found by its worker, an
adapter made for another model of other sizes is copied silently into part of its buffers, and
what fails comes back as one string. So an adapter is read here first (`read_adapter`): its
`adapter_config.json`, its rank against `MAX_LORA_RANK`, the base model it names, and the shapes
of its weights (from the safetensors header, not the weights) against the base model's sizes.
Each refusal says which.

An adapter's name is a model name (in `/v1/models`, logs, metric labels): printable, no spaces,
not starting with `/`, at most `MAX_NAME_LENGTH` characters (`check_adapter_name`). Adapters
loaded at run time are read only from the folders of `SLUICEGATE_LORA_ROOTS`, their real paths
(symlinks resolved) compared (`within_roots`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's `max_lora_rank` takes."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
"""The weights files vLLM reads, in the order it looks for them (it reads the first found)."""
MAX_NAME_LENGTH = 256
"""An adapter's name is at most this long (as a model name of the models file)."""
_HEADER_LIMIT = 64 << 20
"""A safetensors header larger than this is no adapter's."""
_LORA_A = re.compile(r"\.lora_A(?:\.[^.]+)?\.weight$")
_LORA_B = re.compile(r"\.lora_B(?:\.[^.]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be loaded; the message says why (a path at most, no contents)."""


@dataclass(frozen=True, slots=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str | None = None
    """The served base model it belongs to (vLLM's `--lora-modules` field); None: the engine's."""


def parse_lora_modules(value: str) -> list[LoraModule]:
    """`SLUICEGATE_LORA_MODULES`: `name=path` pairs separated by commas, or JSON (an object or
    a list of objects with `name`, `path` and optionally `base_model_name`)."""
    value = value.strip()
    if not value:
        return []
    if value[0] in "[{":
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise AdapterError(f"LORA_MODULES is not valid JSON: {exc}") from None
        items = data if isinstance(data, list) else [data]
        modules = [_module(item) for item in items]
    else:
        modules = []
        for pair in value.split(","):
            name, sep, path = pair.strip().partition("=")
            if not sep or not name.strip() or not path.strip():
                raise AdapterError(f"LORA_MODULES entry {pair.strip()!r} is not name=path")
            modules.append(LoraModule(name.strip(), path.strip()))
    names = [m.name for m in modules]
    for name in names:
        try:
            check_adapter_name(name)
        except AdapterError as exc:
            raise AdapterError(f"LORA_MODULES entry {name[:64]!r}: {exc}") from None
        if names.count(name) > 1:
            raise AdapterError(f"LORA_MODULES names the adapter {name!r} twice")
    return modules


def check_adapter_name(name: str) -> str:
    """`name` if it may name an adapter: 1 to `MAX_NAME_LENGTH` printable characters, no
    spaces, not starting with `/`. Raises `AdapterError` saying so."""
    if not 0 < len(name) <= MAX_NAME_LENGTH:
        raise AdapterError(f"an adapter's name is 1 to {MAX_NAME_LENGTH} characters long")
    if not name.isprintable() or any(c.isspace() for c in name) or name.startswith("/"):
        raise AdapterError(
            "an adapter's name is printable characters only (no control characters), with no "
            "spaces, not starting with '/'"
        )
    return name


def parse_lora_roots(value: str) -> tuple[str, ...]:
    """`SLUICEGATE_LORA_ROOTS`: absolute folders, separated by commas."""
    roots = tuple(root.strip() for root in value.split(",") if root.strip())
    for root in roots:
        if not os.path.isabs(root):
            raise AdapterError(f"LORA_ROOTS entry {root!r} is not an absolute path")
    return roots


def within_roots(path: str | Path, roots: Sequence[str], shown: str) -> Path:
    """The real path of `path` (every symlink resolved), when it lies inside one of `roots`
    (their own real paths); `AdapterError` naming `shown`, not where it leads, otherwise.
    Blocking (it reads links): run it in a thread."""
    try:
        real = os.path.realpath(path)
    except OSError as exc:  # a link changed while it was read
        raise AdapterError(f"lora_path {shown} cannot be resolved: {exc.strerror}") from None
    return inside_roots(real, roots, shown)


def inside_roots(real: str, roots: Sequence[str], shown: str) -> Path:
    """`real`, a path with no symlinks left in it (one read from `/proc/self/fd`), when it lies
    inside one of `roots`; `AdapterError` naming `shown` otherwise, as `within_roots`."""
    for root in roots:
        top = os.path.realpath(root)
        if os.path.commonpath([real, top]) == top:
            return Path(real)
    raise AdapterError(
        f"lora_path {shown} is outside the folders adapters may be loaded from "
        "(SLUICEGATE_LORA_ROOTS)"
    )


def _module(item: object) -> LoraModule:
    if not isinstance(item, dict):
        raise AdapterError("LORA_MODULES JSON entries are objects with name and path")
    unknown = set(item) - {"name", "path", "base_model_name"}
    if unknown:
        raise AdapterError(f"LORA_MODULES entry has unknown fields: {sorted(unknown)}")
    name, path, base = item.get("name"), item.get("path"), item.get("base_model_name")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise AdapterError("each LORA_MODULES entry needs a name and a path (strings)")
    if base is not None and not isinstance(base, str):
        raise AdapterError(f"LORA_MODULES entry {name!r}: base_model_name must be a string")
    return LoraModule(name, path, base)


@dataclass(frozen=True, slots=True)
class BaseModel:
    """What an adapter is checked against: the engine's model."""

    names: frozenset[str]
    """Names an adapter's `base_model_name_or_path` may end with: the model folder's name,
    its hub id's last part, the served name (compared without case)."""
    input_sizes: frozenset[int]
    """Sizes a LoRA `A` matrix may read (the hidden size, the MLP's, the attention's)."""
    output_sizes: frozenset[int]
    """Sizes a LoRA `B` matrix may write (those, and the key/value projections')."""

    @classmethod
    def of(cls, names: set[str], hf_config: Mapping[str, Any]) -> BaseModel:
        """From the model's `config.json` (a decoder's usual fields; sizes left out are not
        checked)."""
        hidden = _int(hf_config.get("hidden_size"))
        heads = _int(hf_config.get("num_attention_heads"))
        kv_heads = _int(hf_config.get("num_key_value_heads")) or heads
        head_dim = _int(hf_config.get("head_dim")) or (hidden // heads if hidden and heads else 0)
        mlp = _int(hf_config.get("intermediate_size"))
        inputs = {s for s in (hidden, mlp, heads * head_dim) if s}
        outputs = inputs | ({kv_heads * head_dim} if kv_heads * head_dim else set())
        return cls(frozenset(n.lower() for n in names if n), frozenset(inputs), frozenset(outputs))


def _int(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    rank: int
    base_model: str | None
    fingerprint: str
    """A digest of its configuration and its weights' names, sizes and times: an adapter
    replaced in place has another (for cache keys)."""


def read_adapter(
    folder_path: str, max_rank: int, base: BaseModel, shown: str | None = None
) -> AdapterInfo:
    """Check the adapter folder at `folder_path` for the engine's `base` model (blocking file
    reads: run it in a thread). Raises `AdapterError` saying what is wrong, naming the folder
    `shown` (the path given, where this is a snapshot of it)."""
    path = shown or folder_path
    folder = Path(folder_path).expanduser()
    if not folder.is_absolute():
        raise AdapterError(f"lora_path {path!r} is not an absolute path")
    if not folder.is_dir():
        raise AdapterError(f"no adapter folder at {path}")
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterError(f"{path} holds no {ADAPTER_CONFIG}: not a PEFT adapter") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}/{ADAPTER_CONFIG} cannot be read: {exc}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path} is not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    ranks = [config.get("r"), *dict(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and r > 0 for r in ranks):
        raise AdapterError(f"{path}: its rank r must be a positive integer")
    rank = max(int(r) for r in ranks)
    if rank > max_rank:
        raise AdapterError(
            f"the adapter's rank {rank} is over the engine's max_lora_rank {max_rank} "
            "(SLUICEGATE_MAX_LORA_RANK)"
        )
    named = config.get("base_model_name_or_path")
    if isinstance(named, str) and named.strip() and base.names:
        last = named.rstrip("/").rsplit("/", 1)[-1].lower()
        if last not in base.names:
            raise AdapterError(
                f"the adapter was made for the base model {named!r}, not for this engine's "
                f"({', '.join(sorted(base.names))})"
            )
    weights = next((folder / w for w in ADAPTER_WEIGHTS if (folder / w).is_file()), None)
    if weights is None:
        raise AdapterError(f"{path} holds no adapter weights ({', '.join(ADAPTER_WEIGHTS)})")
    if weights.suffix == ".safetensors":
        _check_shapes(weights, base)
    stat = weights.stat()
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    digest.update(f"{weights.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return AdapterInfo(rank, named if isinstance(named, str) else None, digest.hexdigest()[:32])


def _check_shapes(weights: Path, base: BaseModel) -> None:
    """Every LoRA matrix's outer size must be one of the base model's: an adapter for another
    model of other sizes is refused, where vLLM would copy it into part of its buffers."""
    with weights.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise AdapterError(f"{weights.name} is not a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > _HEADER_LIMIT:
            raise AdapterError(f"{weights.name} is not a safetensors file")
        try:
            header = json.loads(file.read(length))
        except ValueError:
            raise AdapterError(f"{weights.name} is not a safetensors file") from None
    for name, meta in header.items():
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, list) or len(shape) != 2:
            continue
        if _LORA_A.search(name) and base.input_sizes and shape[1] not in base.input_sizes:
            _wrong_size(name, shape[1], base.input_sizes)
        if _LORA_B.search(name) and base.output_sizes and shape[0] not in base.output_sizes:
            _wrong_size(name, shape[0], base.output_sizes)


def _wrong_size(tensor: str, size: int, sizes: frozenset[int]) -> None:
    raise AdapterError(
        f"the adapter does not fit this engine's base model: {tensor} has size {size}, the "
        f"model's layers have sizes {sorted(sizes)}"
    )
