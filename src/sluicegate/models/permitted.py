"""The registry as one caller sees it: a managed key limited to some models (`models` in its
settings) finds every other name unknown, a 404 as for a name nobody serves, and lists only
its own in `/v1/models`.

A key may use a model when its list holds the name asked for or the model that name resolves
to (an alias of a listed model works; so does a listed alias). A model's fallbacks answer for
it only when the key may use them too (by any of their names): those it may not are passed
over, as if they were not there (a key limited to a cheap model is never answered by a dear
one).
"""

from __future__ import annotations

from sluicegate.errors import ModelNotFoundError
from sluicegate.keys import KeyPolicy
from sluicegate.models.registry import ModelRegistry
from sluicegate.models.served import ServedEmbedder, ServedModel
from sluicegate.wire.formats import ModelCard


class PermittedModels:
    def __init__(self, registry: ModelRegistry, policy: KeyPolicy | None) -> None:
        self._registry = registry
        self._policy = policy

    def may_use(self, name: str) -> bool:
        policy = self._policy
        return policy is None or policy.permits(name, self._registry.target(name))

    def _check(self, name: str) -> None:
        if not self.may_use(name):
            raise ModelNotFoundError(f"The model `{name}` does not exist.", param="model")

    def resolve(self, name: str) -> ServedModel:
        self._check(name)
        return self._registry.resolve(name)

    def resolve_embedder(self, name: str) -> ServedEmbedder:
        self._check(name)
        return self._registry.resolve_embedder(name)

    def resolve_any(self, name: str) -> ServedModel | ServedEmbedder:
        self._check(name)
        return self._registry.resolve_any(name)

    def chain(self, name: str) -> list[ServedModel]:
        """The model `name`, then those of its fallbacks the key may use."""
        self._check(name)
        first, *fallbacks = self._registry.chain(name)
        if self._policy is None:
            return [first, *fallbacks]
        permits = self._policy.permits
        return [first, *(m for m in fallbacks if permits(*self._registry.names_of(m.name)))]

    @property
    def default(self) -> ServedModel | ServedEmbedder:
        """What answers where a request names no model (`/tokenize`): the registry's first
        model, or the first the key may use."""
        default = self._registry.default
        if self.may_use(default.name):
            return default
        for card in self.cards():
            return self._registry.resolve_any(card["id"])
        raise ModelNotFoundError("This API key may use no model served here.", param="model")

    def cards(self) -> list[ModelCard]:
        return [card for card in self._registry.cards() if self.may_use(card["id"])]
