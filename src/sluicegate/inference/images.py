"""A request's images on their way to the engine: refused by a model that reads text only
before anything is fetched, counted against the bound, then read once (`media.MediaLoader`)
however many models of a fallback chain prepare the request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.engine.protocol import EngineClient, PromptImage
from sluicegate.errors import MediaError
from sluicegate.media.loader import ImageSource, LoadedImage, MediaLoader
from sluicegate.observability.metrics import MEDIA_REFUSALS
from sluicegate.wire.requests import TEXT_ONLY, ImageURL


@dataclass(frozen=True, slots=True)
class CountedImages:
    """A request's images read, and what they add to its prompt on one engine."""

    images: tuple[PromptImage, ...]
    tokens: int
    exact: bool
    """False: `tokens` is an estimate (an upstream's), its usage the count."""


class RequestImages:
    def __init__(
        self,
        parts: Sequence[tuple[str, ImageURL]],
        loader: MediaLoader,
        part_type: str = "image_url",
    ) -> None:
        """`parts`: the request's images in order, each with the client's name for it
        (`messages.1.content.2`); `part_type` is the API's name of an image part (a
        text-only refusal names it)."""
        self._parts = list(parts)
        self._loader = loader
        self._part_type = part_type
        self._loaded: tuple[PromptImage, ...] | None = None

    def __len__(self) -> int:
        return len(self._parts)

    def check_count(self) -> None:
        """The bound on a request's images, before anything is rendered or read."""
        self._loader.check_count(len(self._parts))

    async def counted(self, engine: EngineClient) -> CountedImages:
        """The images read (once), and the tokens they add on `engine`; an image the engine
        refuses is a `MediaError` naming its part."""
        images = await self.load()
        try:
            counts, exact = await engine.image_tokens(images)
        except MediaError as exc:
            if exc.index is None:
                raise
            MEDIA_REFUSALS.labels(exc.reason).inc()
            raise exc.for_part(self._parts[exc.index][0]) from None
        return CountedImages(images, sum(counts), exact)

    def refuse_text_only(self) -> None:
        """The refusal of a model that reads text only, naming the first image."""
        MEDIA_REFUSALS.labels("text_only").inc()
        param = self._parts[0][0]
        # The words a text-only model has always refused images with (at the parse, before).
        message = f"Invalid value for '{param}': {TEXT_ONLY.format(type=self._part_type)}."
        raise MediaError("text_only", message, param=param)

    async def load(self) -> tuple[PromptImage, ...]:
        """The images read (once: a second model of the chain gets the same)."""
        if self._loaded is None:
            sources = [ImageSource(param, url=image.url) for param, image in self._parts]
            loaded = await self._loader.load_all(sources)
            self._loaded = tuple(
                _prompt_image(image, part)
                for image, (_, part) in zip(loaded, self._parts, strict=True)
            )
        return self._loaded


def _fetched(image: ImageURL) -> bool:
    return image.url[:5].lower() != "data:"


def _prompt_image(image: LoadedImage, part: ImageURL) -> PromptImage:
    return PromptImage(
        image.digest,
        image.media_type,
        image.data,
        image.image,
        detail=part.detail,
        url=part.url if _fetched(part) else None,
    )
