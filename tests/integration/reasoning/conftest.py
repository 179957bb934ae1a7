"""One pair of engines for the package: vLLM's own server and the gateway, both on the reasoning
variant of the bundled model (`tests.support.reasoning_model`) with vLLM's `step3` parser and
the variant's chat template, started together; and, for the tests of the upstream path, a
gateway with no engine of its own in front of vLLM's server (`remote`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess, running_gateway, started_together, vllm_server
from tests.support.reasoning_model import PARSER, TEMPLATE_FILE, reasoning_model

SERVED = "reasoner"
REMOTE = "remote"
"""The model name of vLLM's server behind `remote`."""


@dataclass(frozen=True)
class Pair:
    vllm: str
    """vLLM's server's base URL (ending in /v1)."""
    gateway: GatewayProcess


@pytest.fixture(scope="package")
def reasoning_folder() -> Path:
    return reasoning_model()


@pytest.fixture(scope="package")
def pair(reasoning_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("reasoning")
    template = reasoning_folder / TEMPLATE_FILE
    flags = ["--reasoning-parser", PARSER, "--chat-template", str(template)]
    # Tool calls as the gateway reads them from the bundled model's (Hermes) format, a forced
    # call's arguments held to the tool's schema whether the tool says `strict` or not (as
    # the gateway holds them; vLLM's default holds only tools that say it).
    flags += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    flags += ["--tool-strict-level", "parameter"]
    env = {
        "SLUICEGATE_MODEL": str(reasoning_folder),
        "SLUICEGATE_SERVED_MODEL_NAME": SERVED,
        "SLUICEGATE_REASONING_PARSER": PARSER,
        "SLUICEGATE_CHAT_TEMPLATE": str(template),
        # vLLM's server lets JSON grammars take whitespace: so does the gateway here.
        "SLUICEGATE_STRUCTURED_COMPACT_WHITESPACE": "false",
    }
    with started_together(
        vllm_server(folder, *flags, served_model_name=SERVED, model=reasoning_folder),
        running_gateway(folder, env=env),
    ) as (url, gateway):
        yield Pair(url, gateway)


@pytest.fixture(scope="package")
def remote(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway in front of vLLM's server of the pair (which splits the thoughts itself), as
    the model `remote`: its start loads no engine."""
    folder = tmp_path_factory.mktemp("remote")
    models = folder / "models.yaml"
    models.write_text(f"models:\n  - name: {REMOTE}\n    upstreams: [{{url: '{pair.vllm}'}}]\n")
    with running_gateway(folder, env={"SLUICEGATE_MODELS_FILE": str(models)}) as gateway:
        yield gateway
