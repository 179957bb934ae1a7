from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluicegate.engine.tokenizer import HFPromptTokenizer


@pytest.fixture(scope="session")
def hf_tokenizer() -> Iterator[HFPromptTokenizer]:
    """The bundled model's own tokenizer and chat template, loaded from the prepared folder
    (`sluicegate model prepare`), as the engine adapter wraps it."""
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir
    from sluicegate.settings import Settings

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    tokenizer = HFPromptTokenizer(
        AutoTokenizer.from_pretrained(bundled_model_dir(settings.model_cache_dir))
    )
    yield tokenizer
    tokenizer.close()
