"""The traffic capture (`TRAFFIC_CAPTURE`): its file, made new and private, and the capture
that writes it, closed with the lifespan."""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import BinaryIO

from sluicegate.errors import GatewayError
from sluicegate.models.registry import ModelRegistry
from sluicegate.models.served import ServedModel
from sluicegate.observability.capture import TrafficCapture
from sluicegate.settings import Settings

logger = logging.getLogger(__name__)

FILE_MODE = 0o600
"""The profile says what the traffic was like, and when: the gateway's user's alone."""


class CaptureFileError(Exception):
    """The capture's file cannot be made; the message is one line for the operator."""


def check_capture_file(path: Path | None) -> None:
    """Refuse, before anything starts, a capture file that exists or has no folder to be
    made in (`open_capture_file` refuses it again, at once, when it is made)."""
    if path is None:
        return
    path = path.expanduser()
    if path.exists() or path.is_symlink():
        raise _exists(path)
    if not path.parent.is_dir():
        raise CaptureFileError(f"SLUICEGATE_TRAFFIC_CAPTURE: no folder {path.parent}")


def open_capture_file(path: Path) -> BinaryIO:
    """`path`, made new (never an existing file, nor one a symbolic link names: `O_EXCL`),
    for its owner alone."""
    path = path.expanduser()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        raise _exists(path) from None
    except OSError as exc:
        raise CaptureFileError(f"SLUICEGATE_TRAFFIC_CAPTURE: {path}: {exc.strerror}") from None
    return os.fdopen(fd, "wb")


def _exists(path: Path) -> CaptureFileError:
    return CaptureFileError(
        f"SLUICEGATE_TRAFFIC_CAPTURE: {path} exists; a capture is never appended to nor "
        "overwritten: move it, or name a new file"
    )


def max_model_len(models: ModelRegistry) -> int | None:
    """The largest window of the generative models: every captured request fits it."""
    windows = []
    for name in models.names():
        try:
            served = models.resolve_any(name)
        except GatewayError:  # an upstream's adapter gone meanwhile
            continue
        if isinstance(served, ServedModel):
            windows.append(served.engine.max_model_len)
    return max(windows, default=None)


def enter_capture(
    settings: Settings, stack: AsyncExitStack, models: ModelRegistry
) -> TrafficCapture | None:
    """The capture the settings ask for, closed (what it holds written) with `stack`; None
    when off."""
    path = settings.traffic_capture
    if path is None:
        return None
    capture = TrafficCapture.open(
        open_capture_file(path),
        sample=settings.traffic_capture_sample,
        max_bytes=settings.traffic_capture_max_bytes,
        max_model_len=max_model_len(models),
    )
    stack.push_async_callback(capture.close)
    logger.info(
        "capturing the traffic to %s (sample %g, at most %d bytes)",
        path,
        settings.traffic_capture_sample,
        settings.traffic_capture_max_bytes,
    )
    return capture
