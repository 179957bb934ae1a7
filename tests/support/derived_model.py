"""Models the tests make from the bundled one (`reasoning_model.py`, `vision_model.py`): each
made once in a folder beside it, and made again when the bundled model or the recipe changes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path


def derived_model(
    suffix: str,
    recipe: str,
    marker: str,
    build: Callable[[Path, Path], None],
    folder: Path | None = None,
) -> Path:
    """The folder `<bundled model>-<suffix>` (or `folder`), made by `build(source, partial)`
    into a partial folder renamed when done, and kept while its `marker` file holds `recipe`
    and the bundled model's own ready marker."""
    from sluicegate.engine.model import READY_MARKER, bundled_model_dir
    from sluicegate.settings import Settings

    source = bundled_model_dir(Settings().model_cache_dir)
    target = folder or source.with_name(f"{source.name}-{suffix}")
    stamp = f"{recipe}\n{(source / READY_MARKER).read_text()}"
    done = target / marker
    if done.exists() and done.read_text() == stamp:
        return target
    shutil.rmtree(target, ignore_errors=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build(source, partial)
    partial.rename(target)
    done.write_text(stamp)
    return target
