"""One pair of engines for the package: vLLM's own server and the gateway, both on the vision
model the tests make (`tests.support.vision_model`) with its chat template, started together.
The gateway may fetch images from 127.0.0.2 (`MEDIA_ALLOWED_HOSTS`), where the tests serve
them; vLLM's server fetches what it is sent itself."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess, running_gateway, started_together, vllm_server
from tests.support.vision_model import vision_model

SERVED = "seer"
IMAGE_HOST = "127.0.0.2"


@dataclass(frozen=True)
class Pair:
    vllm: str
    """vLLM's server's base URL (ending in /v1)."""
    gateway: GatewayProcess


@pytest.fixture(scope="package")
def vision_folder() -> Path:
    return vision_model()


@pytest.fixture(scope="package")
def pair(vision_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("vision")
    template = vision_folder / "chat_template.jinja"
    flags = ["--chat-template", str(template), "--limit-mm-per-prompt", '{"image": 8}']
    env = {
        "SLUICEGATE_MODEL": str(vision_folder),
        "SLUICEGATE_SERVED_MODEL_NAME": SERVED,
        "SLUICEGATE_CHAT_TEMPLATE": str(template),
        "SLUICEGATE_MEDIA_ALLOWED_HOSTS": IMAGE_HOST,
    }
    with started_together(
        vllm_server(folder, *flags, served_model_name=SERVED, model=vision_folder),
        running_gateway(folder, env=env),
    ) as (url, gateway):
        yield Pair(url, gateway)
