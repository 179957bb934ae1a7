"""The registry as a key limited to some models sees it (`models.permitted`)."""

from __future__ import annotations

import pytest

from sluicegate.errors import ModelNotFoundError
from sluicegate.keys import KeyPolicy
from sluicegate.models.permitted import PermittedModels
from sluicegate.models.registry import ModelRegistry
from tests.support.fakes import FakeEngine
from tests.unit.models.test_registry import build, served


@pytest.fixture
def registry() -> ModelRegistry:
    models = [served("a", FakeEngine(), fallbacks=("b",)), served("b", FakeEngine())]
    return ModelRegistry(models, {"fast": "a", "cheap": "b"}, build)


def test_names_outside_the_list_are_unknown(registry: ModelRegistry) -> None:
    seen = PermittedModels(registry, KeyPolicy(models=frozenset({"a"})))
    assert seen.resolve("a").name == "a"
    assert seen.resolve("fast").name == "a"  # an alias of a listed model
    for name in ("b", "cheap", "nothing"):
        with pytest.raises(ModelNotFoundError) as caught:
            seen.resolve(name)
        assert caught.value.status_code == 404 and f"`{name}` does not exist" in str(caught.value)
    # A model's fallbacks answer for it only where the key may use them.
    assert [m.name for m in seen.chain("a")] == ["a"]
    wider = PermittedModels(registry, KeyPolicy(models=frozenset({"a", "b"})))
    assert [m.name for m in wider.chain("fast")] == ["a", "b"]
    by_alias = PermittedModels(registry, KeyPolicy(models=frozenset({"a", "cheap"})))
    assert [m.name for m in by_alias.chain("a")] == ["a", "b"]  # b is the key's, as `cheap`
    assert [m.name for m in PermittedModels(registry, None).chain("a")] == ["a", "b"]
    assert {card["id"] for card in seen.cards()} == {"a", "fast"}


def test_a_listed_alias_is_enough(registry: ModelRegistry) -> None:
    seen = PermittedModels(registry, KeyPolicy(models=frozenset({"cheap"})))
    assert seen.resolve("cheap").name == "b"
    assert seen.default.name == "b"  # the registry's first model is not the key's
    with pytest.raises(ModelNotFoundError):
        seen.resolve("a")


def test_without_a_list_every_model_is_seen(registry: ModelRegistry) -> None:
    seen = PermittedModels(registry, None)
    assert len(seen.cards()) == len(registry.cards())
    assert seen.default.name == "a"
    empty = PermittedModels(registry, KeyPolicy(models=frozenset()))
    assert empty.cards() == []
    with pytest.raises(ModelNotFoundError):
        _ = empty.default
