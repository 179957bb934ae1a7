"""Memory counted with tracemalloc, with the other threads of the test process kept out."""

from __future__ import annotations

import contextlib
import sys
import tracemalloc
from collections.abc import Iterator


@contextlib.contextmanager
def traced_alone() -> Iterator[None]:
    """tracemalloc on for the block, while other threads wait for the GIL: the block does no
    blocking I/O of its own, so it keeps the GIL and the count holds this thread's allocations.
    Two CI runs failed when a leftover thread's reconnects were counted as the code's."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1_000.0)
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        sys.setswitchinterval(interval)
