"""The registry alone: names, aliases, fallback chains, cards, adapters of the in-process
engine (over a stand-in for vLLM's `AsyncLLM`) and of pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.engine.lora import BaseModel
from sluicegate.engine.protocol import EngineClient
from sluicegate.engine.vllm_adapters import LoadedAdapters
from sluicegate.errors import InvalidRequestError, ModelNotFoundError, NotFoundError
from sluicegate.inference.service import CompletionService
from sluicegate.models.registry import LocalEngine, ModelRegistry
from sluicegate.models.served import ServedModel
from sluicegate.quota.quotas import ModelQuota
from sluicegate.quota.window import RateLimit
from tests.support.fakes import FakeEngine, FakeLoraLLM


def build(engine: EngineClient, name: str, identity: str, adapter: str | None) -> CompletionService:
    return CompletionService(engine, name, identity=identity, adapter=adapter)


def served(name: str, engine: FakeEngine, **extra: Any) -> ServedModel:
    return ServedModel(name, build(engine, name, f"id-{name}", None), f"/models/{name}", 1, **extra)


def adapter_folder(tmp_path: Path, name: str = "ad1") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.bin").write_bytes(b"weights")
    return str(folder)


@pytest.fixture
def registry() -> ModelRegistry:
    a, b, c = FakeEngine(), FakeEngine(), FakeEngine()
    models = [
        served("a", a, fallbacks=("b", "c")),
        served("b", b, fallbacks=("c",)),
        served("c", c, fallbacks=("a",)),
    ]
    return ModelRegistry(models, {"default": "a", "gpt-4o-mini": "b"}, build)


def test_names_and_aliases_resolve_to_their_model(registry: ModelRegistry) -> None:
    assert registry.resolve("a").name == "a"
    assert registry.resolve("default").name == "a"
    assert registry.resolve("gpt-4o-mini").name == "b"
    assert registry.default.name == "a"


def test_an_unknown_name_is_model_not_found(registry: ModelRegistry) -> None:
    with pytest.raises(ModelNotFoundError) as caught:
        registry.resolve("gpt-5")
    assert caught.value.status_code == 404 and caught.value.code == "model_not_found"
    assert caught.value.param == "model"


def test_a_chain_is_the_model_then_its_fallbacks_depth_first_each_once(
    registry: ModelRegistry,
) -> None:
    assert [m.name for m in registry.chain("default")] == ["a", "b", "c"]
    assert [m.name for m in registry.chain("c")] == ["c", "a", "b"]


def test_cards_list_every_model_and_alias(registry: ModelRegistry) -> None:
    cards = {card["id"]: card for card in registry.cards()}
    assert set(cards) == {"a", "b", "c", "default", "gpt-4o-mini"}
    assert cards["default"]["root"] == "/models/a" and cards["a"]["parent"] is None


async def test_adapters_load_as_models_of_their_own_and_unload(tmp_path: Path) -> None:
    engine = FakeEngine()
    llm = FakeLoraLLM()
    adapters = LoadedAdapters(llm, 16, BaseModel.of(set(), {}))
    local = LocalEngine("base", engine, adapters, "base-identity")
    registry = ModelRegistry([served("base", engine, local=True)], {}, build, local)
    path = adapter_folder(tmp_path)
    model = await registry.load_adapter("ad1", path)
    assert registry.resolve("ad1") is model
    assert model.parent == "base" and model.root == path and model.engine is engine
    assert model.service.identity.startswith("base-identity+lora:ad1:")
    card = next(c for c in registry.cards() if c["id"] == "ad1")
    assert card["parent"] == "base"
    assert [r.lora_name for r in llm.added] == ["ad1"]
    with pytest.raises(InvalidRequestError, match="already served"):
        await registry.load_adapter("ad1", path)
    with pytest.raises(InvalidRequestError, match="already served"):
        await registry.load_adapter("base", path)
    registry.unload_adapter("ad1")
    with pytest.raises(ModelNotFoundError):
        registry.resolve("ad1")
    with pytest.raises(NotFoundError, match="not loaded"):
        registry.unload_adapter("ad1")
    with pytest.raises(NotFoundError, match="not loaded"):
        registry.unload_adapter("base")  # a base model is no adapter
    await adapters.close()


async def test_an_adapter_loaded_again_from_elsewhere_is_another_identity(tmp_path: Path) -> None:
    """Answers remembered for the first load must not be served for the second."""
    engine = FakeEngine()
    adapters = LoadedAdapters(FakeLoraLLM(), 16, BaseModel.of(set(), {}))
    local = LocalEngine("base", engine, adapters, "base-identity")
    registry = ModelRegistry([served("base", engine, local=True)], {}, build, local)
    first = await registry.load_adapter("ad1", adapter_folder(tmp_path, "one"))
    assert registry.serves("ad1", first.service.identity)
    registry.unload_adapter("ad1")
    assert not registry.serves("ad1", first.service.identity)
    await registry.load_adapter("ad1", adapter_folder(tmp_path, "two"))
    assert not registry.serves("ad1", first.service.identity)
    await adapters.close()


def test_without_lora_adapters_cannot_be_loaded(registry: ModelRegistry) -> None:
    with pytest.raises(NotFoundError, match="not enabled"):
        registry.unload_adapter("x")


def test_a_pools_adapters_are_names_while_its_upstreams_list_them() -> None:
    engine = FakeEngine()
    listed = ["lora-a", "evil\x1b[2J", "x" * 300]
    pool = served("pool", engine)
    registry = ModelRegistry([pool], {}, build, pools=[(pool, lambda: listed)])
    adapter = registry.resolve("lora-a")
    assert adapter.parent == "pool" and adapter.engine is engine
    assert adapter.service.identity == "upstream:lora-a"
    # Names no adapter may have (control characters, too long) are not served.
    assert {c["id"] for c in registry.cards()} == {"pool", "lora-a"}
    listed.clear()
    with pytest.raises(ModelNotFoundError):
        registry.resolve("lora-a")


async def test_adapters_share_their_base_models_limits(tmp_path: Path) -> None:
    """A pool's adapter, or the engine's, counts against its base model's `rate_limit`: the
    same bucket, not one of its own of the same size."""
    limit = ModelQuota("pool", RateLimit(requests_per_minute=10))
    engine = FakeEngine()
    pool = served("pool", FakeEngine(), quota=limit)
    base = served("base", engine, local=True, quota=ModelQuota("base", RateLimit(5)))
    adapters = LoadedAdapters(FakeLoraLLM(), 16, BaseModel.of(set(), {}))
    local = LocalEngine("base", engine, adapters, "base-identity")
    registry = ModelRegistry(
        [pool, base], {"cheap": "pool"}, build, local, pools=[(pool, lambda: ["lora-a"])]
    )
    assert registry.resolve("lora-a").quota is limit
    assert registry.resolve("cheap").quota is limit
    loaded = await registry.load_adapter("ad1", adapter_folder(tmp_path))
    assert loaded.quota is base.quota
    assert loaded.quota is not None and loaded.quota.bucket == "model:base"
    await adapters.close()
