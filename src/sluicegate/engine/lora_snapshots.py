"""Copies of LoRA adapters in a folder the gateway owns, which vLLM is given in their place.

vLLM keeps at most `max_cpu_loras` adapters in memory; one it has evicted is read again from
its `lora_path` when a request next names it, inside a model step, where a failure kills the
engine: an adapter whose folder was changed or removed since it was checked would take the
gateway down. So vLLM never reads the operator's folder: the files it reads
(`adapter_config.json`, and the first weights file of `ADAPTER_WEIGHTS`) are copied into a
folder of this process's temporary folder, checked there, and vLLM is given that copy, which
nothing but the gateway changes. A snapshot is removed once vLLM has dropped its adapter, and
the whole folder when the engine stops.

The adapter's folder is opened once, and its files through that descriptor, regular files
only: a FIFO or a device never reaches a read that would not end. With roots, what is checked
against them is what each descriptor is open on (`/proc/self/fd`), after opening: a folder on
the way swapped for a symlink between a check of the path and its opening leads nowhere
outside them. The folder is locked (`flock`) for the process's life, so that
systemd-tmpfiles' ageing of the temporary folder passes it over.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sluicegate.engine.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterError,
    inside_roots,
    within_roots,
)
from sluicegate.errors import EngineUnavailableError

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
        saying why not, naming `source`; `EngineUnavailableError` when the gateway's own
        folder cannot take the copy."""
        given = Path(source).expanduser()
        if not given.is_absolute():
            raise AdapterError(f"lora_path {source!r} is not an absolute path")
        try:
            real = (
                within_roots(given, roots, source) if roots is not None else os.path.realpath(given)
            )
            folder = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            raise AdapterError(f"no adapter folder at {source}") from None
        except OSError as exc:
            raise AdapterError(f"{source} cannot be read: {exc.strerror}") from None
        try:
            # What was opened, not what the path led to when checked: a folder on the way
            # swapped for a symlink meanwhile leads elsewhere.
            if roots is not None:
                inside_roots(_opened(folder), roots, source)
            return self._take(folder, source, key, roots)
        finally:
            os.close(folder)

    def _take(self, folder: int, source: str, key: str, roots: Sequence[str] | None) -> str:
        # The first present, even as a dangling or outward link: `_copy` says what is wrong
        # with it (testing it here would tell of files outside the roots).
        weights = next((w for w in ADAPTER_WEIGHTS if _present(folder, w)), None)
        try:
            into = self._root() / key
            into.mkdir()
        except OSError as exc:
            raise _unusable(exc) from None
        try:
            _copy(folder, ADAPTER_CONFIG, into, source, roots)
            if weights is None:
                listed = ", ".join(ADAPTER_WEIGHTS)
                raise AdapterError(f"{source} holds no adapter weights ({listed})")
            _copy(folder, weights, into, source, roots)
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


def _copy(folder: int, name: str, into: Path, source: str, roots: Sequence[str] | None) -> None:
    """Copy the file `name` of the open `folder` into `into`, with its times (they are part
    of the adapter's fingerprint)."""
    shown = f"{source}/{name}"
    if roots is not None:  # refused unopened: a link out says nothing of what it leads to
        within_roots(f"{_opened(folder)}/{name}", roots, shown)
    try:
        # O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=folder)
    except FileNotFoundError:
        if name == ADAPTER_CONFIG:
            raise AdapterError(f"{source} holds no {ADAPTER_CONFIG}: not a PEFT adapter") from None
        raise AdapterError(f"{shown} cannot be read: it is gone") from None
    except OSError as exc:
        raise AdapterError(f"{shown} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as reader:
        if roots is not None:  # what was opened, whatever the links led to when checked
            inside_roots(_opened(fd), roots, shown)
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise AdapterError(f"{shown} is not a regular file")
        try:
            writer = (into / name).open("xb")
        except OSError as exc:
            raise _unusable(exc) from None
        with writer:
            while True:
                try:
                    chunk = reader.read(_CHUNK)
                except OSError as exc:
                    raise AdapterError(f"{shown} cannot be read: {exc.strerror}") from None
                if not chunk:
                    break
                try:
                    writer.write(chunk)
                except OSError as exc:
                    raise _unusable(exc) from None
    try:
        os.utime(into / name, ns=(status.st_atime_ns, status.st_mtime_ns))
    except OSError as exc:
        raise _unusable(exc) from None


def _opened(fd: int) -> str:
    """The real path of what `fd` is open on."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _present(folder: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=folder)
    except OSError:
        return False
    return True


def _unusable(exc: OSError) -> EngineUnavailableError:
    """The gateway's own folder failed it (missing, read-only, full): not the adapter's fault.
    Its path is the host's business, not the caller's."""
    return EngineUnavailableError(
        "The gateway's temporary folder (TMPDIR) cannot take a copy of the adapter: "
        f"{exc.strerror or exc}.",
        code="snapshots_unavailable",
    )
