"""Copies of LoRA adapters in a folder the gateway owns, which vLLM is given in their place.

vLLM keeps at most `max_cpu_loras` adapters in memory; one it has evicted is read again from
its `lora_path` when a request next names it, inside a model step, where a failure kills the
engine: an adapter whose folder was changed or removed since it was checked would take the
gateway down. So vLLM never reads the operator's folder: the files it reads
(`adapter_config.json`, and the first weights file of `ADAPTER_WEIGHTS`) are copied into a
folder of this process's temporary folder, checked there, and vLLM is given that copy, which
nothing but the gateway changes. A snapshot is removed once vLLM has dropped its adapter, and
the whole folder when the engine stops.

Files are opened as their real paths (symlinks resolved, and checked against the roots when
there are some), regular files only: a FIFO or a device never reaches a read that would not
end. The folder is locked (`flock`) for the process's life, so that systemd-tmpfiles' ageing
of the temporary folder passes it over.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sluicegate.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterError, within_roots

_CHUNK = 1 << 20


class Snapshots:
    """The adapters' copies, each in a folder of its own, under one folder made at the first
    (`take`) and removed by `close`. Every method blocks: run them in a thread."""

    def __init__(self, parent: str | None = None) -> None:
        """`parent`: where the folder is made (None: the temporary folder, `TMPDIR`)."""
        self._parent = parent
        self._folder: Path | None = None
        self._lock: int | None = None

    def take(self, source: str, key: str, roots: Sequence[str] | None) -> str:
        """Copy the adapter at `source` into a snapshot named `key`; its path. `roots`: the
        folders it must be inside (symlinks resolved), None: anywhere. Raises `AdapterError`
        saying why not, naming `source`."""
        given = Path(source).expanduser()
        if not given.is_absolute():
            raise AdapterError(f"lora_path {source!r} is not an absolute path")
        real = within_roots(given, roots, source) if roots is not None else given.resolve()
        if not real.is_dir():
            raise AdapterError(f"no adapter folder at {source}")
        # The first present, even as a dangling or outward link: `_copy` says what is wrong
        # with it (testing it here would tell of files outside the roots).
        weights = next((w for w in ADAPTER_WEIGHTS if os.path.lexists(real / w)), None)
        into = self._root() / key
        into.mkdir()
        try:
            _copy(real / ADAPTER_CONFIG, into, source, roots)
            if weights is None:
                listed = ", ".join(ADAPTER_WEIGHTS)
                raise AdapterError(f"{source} holds no adapter weights ({listed})")
            _copy(real / weights, into, source, roots)
        except BaseException:
            shutil.rmtree(into, ignore_errors=True)
            raise
        return str(into)

    def drop(self, snapshot: str) -> None:
        """Remove a snapshot (once vLLM no longer holds its adapter)."""
        shutil.rmtree(snapshot, ignore_errors=True)

    def close(self) -> None:
        """Remove every snapshot and their folder."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _root(self) -> Path:
        if self._folder is None:
            folder = Path(tempfile.mkdtemp(prefix="sluicegate-lora-", dir=self._parent))
            self._lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self._lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            self._folder = folder
        return self._folder


def _copy(file: Path, into: Path, source: str, roots: Sequence[str] | None) -> None:
    """Copy `file` into `into`, with its times (they are part of the adapter's fingerprint)."""
    shown = f"{source}/{file.name}"
    real = within_roots(file, roots, shown) if roots is not None else Path(os.path.realpath(file))
    try:
        # O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting.
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if file.name == ADAPTER_CONFIG:
            raise AdapterError(f"{source} holds no {ADAPTER_CONFIG}: not a PEFT adapter") from None
        raise AdapterError(f"{shown} cannot be read: it is gone") from None
    except OSError as exc:
        raise AdapterError(f"{shown} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as reader:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise AdapterError(f"{shown} is not a regular file")
        try:
            with (into / file.name).open("xb") as writer:
                shutil.copyfileobj(reader, writer, _CHUNK)
        except OSError as exc:
            raise AdapterError(f"{shown} cannot be copied: {exc.strerror}") from None
    os.utime(into / file.name, ns=(status.st_atime_ns, status.st_mtime_ns))
