from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from sluicegate.engine.tokenizer import HFPromptTokenizer
from tests.support.redis_server import shared_redis_url


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of the test's own, its keys deleted afterwards."""
    value = f"test-{uuid.uuid4().hex}"
    yield value
    client = redis.Redis.from_url(shared_redis_url())
    keys = list(client.scan_iter(match=f"{value}*"))
    if keys:
        client.delete(*keys)
    client.close()


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
