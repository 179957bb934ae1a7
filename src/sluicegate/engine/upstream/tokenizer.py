"""The token budget's counts in upstream mode: a local tokenizer, or an upstream's `/tokenize`.

`tokenizer_for` picks, at start-up: the configured local tokenizer (`SLUICEGATE_TOKENIZER`),
else the upstream's own `/tokenize` (vLLM's server has one) if it counts, else none (the
budget is off for the pool).

The upstream applies its chat template and counts, so the budget sees exactly what the
upstream will. Each count is one HTTP request, so a request is never counted in parts: a
prompt that does not fit is counted once more with its contents left out (the template's
framing), and the split that truncation needs is estimated from characters at the density
of the contents' share (`proportional_encoding`). Truncation estimates the parts it cuts at
that density too (`ChatEncoding.tokens_per_char`) and checks only the prompt it chose, whole:
a handful of calls per request, where counting each message and sentence took thousands.

A server whose `/tokenize` is not vLLM's can still answer 200: llama.cpp's wants `content`,
not `prompt`, and counts nothing. `probe` tells that from a real count before the budget
relies on it, and every answer's shape is checked, so a bad one is an error, not a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from sluicegate.engine.protocol import (
    ChatEncoding,
    ChatMessages,
    PromptTokenizer,
    TemplateKwargs,
    Tokenized,
    Tools,
)
from sluicegate.engine.tokenizer import HFPromptTokenizer, estimated_encoding
from sluicegate.engine.upstream.config import UpstreamConfig
from sluicegate.engine.upstream.discovery import UpstreamStartError
from sluicegate.engine.upstream.server import Upstream
from sluicegate.engine.upstream.wire import error_fields, wire_message
from sluicegate.errors import EngineUnavailableError, GatewayError, InvalidRequestError

logger = logging.getLogger(__name__)

UNKNOWN_VOCAB = 2**31 - 1
"""The vocabulary size when the upstream does not say: ids are checked by the upstream."""
_CONCURRENT_COUNTS = 8
PROBE_TEXT = "Sluicegate counts the tokens of this sentence."


class RemoteTokenizer:
    """`PromptTokenizer` over an upstream's `/tokenize` and `/detokenize`."""

    def __init__(self, client: httpx.AsyncClient, origin: str, model: str) -> None:
        self._client = client
        self._origin = origin
        self._model = model
        self._limit = asyncio.Semaphore(_CONCURRENT_COUNTS)

    @property
    def vocab_size(self) -> int:
        return UNKNOWN_VOCAB

    async def encode_chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        return await self._chat_ids(
            messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs
        )

    async def encode_chat_counted(
        self,
        messages: ChatMessages,
        ids_up_to: int | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        ids = await self.encode_chat(messages, tools, template_kwargs)
        if ids_up_to is None or len(ids) > ids_up_to:
            blank = [{**m, "content": ""} for m in messages]
            try:
                framing = len(await self.encode_chat(blank, tools, template_kwargs))
            except InvalidRequestError:  # a template that wants contents: all is content
                framing = 0
            contents = [len(str(m.get("content") or "")) for m in messages]
            return proportional_encoding(ids, framing, contents)
        return ChatEncoding(ids, (0,) * len(messages), (0,) * len(messages))

    async def probe(self) -> None:
        """Check that `/tokenize` counts: `EngineUnavailableError` (saying why) unless a known
        text comes back as a non-empty list of ids."""
        if not (await self.tokenize(PROBE_TEXT, add_special_tokens=False)).ids:
            raise EngineUnavailableError("The upstream's /tokenize counted no tokens.")

    async def encode(self, text: str) -> list[int]:
        return (await self.tokenize(text)).ids

    async def count(self, texts: Sequence[str]) -> list[int]:
        """One request per text (vLLM's `/tokenize` takes one): the budget does not count
        parts through this tokenizer (see the module's docstring)."""

        async def one(text: str) -> int:
            if not text:
                return 0
            async with self._limit:
                return len((await self.tokenize(text, add_special_tokens=False)).ids)

        return list(await asyncio.gather(*(one(t) for t in texts)))

    async def tokenize(
        self, text: str, add_special_tokens: bool = True, with_strings: bool = False
    ) -> Tokenized:
        body = {
            "model": self._model,
            "prompt": text,
            "add_special_tokens": add_special_tokens,
            "return_token_strs": with_strings,
        }
        answer = await self._post("/tokenize", body)
        strings = answer.get("token_strs") if with_strings else None
        return Tokenized(_ids(answer), list(strings) if strings is not None else None)

    async def render_chat(
        self,
        messages: ChatMessages,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> str:
        ids = await self._chat_ids(
            messages, None, add_generation_prompt, continue_final_message, template_kwargs
        )
        return await self.decode(ids)

    async def decode(self, token_ids: Sequence[int]) -> str:
        answer = await self._post("/detokenize", {"model": self._model, "tokens": list(token_ids)})
        text = answer.get("prompt")
        if not isinstance(text, str):
            raise EngineUnavailableError("The upstream's /detokenize sent no prompt.")
        return text

    async def _chat_ids(
        self,
        messages: ChatMessages,
        tools: Tools | None,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [wire_message(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
        }
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if template_kwargs:
            # vLLM's `/tokenize` renders chats with them, as its chat route does.
            body["chat_template_kwargs"] = dict(template_kwargs)
        return _ids(await self._post("/tokenize", body))

    async def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            response = await self._client.post(self._origin + path, json=body)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"The upstream's {path} did not answer.") from exc
        if response.status_code == 400:
            message = error_fields(response.content)[0]
            raise InvalidRequestError(message or f"The upstream's {path} refused the input.")
        if response.status_code != 200:
            raise EngineUnavailableError(f"The upstream's {path} answered {response.status_code}.")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise EngineUnavailableError(f"The upstream's {path} sent no JSON object.")
        return answer


def proportional_encoding(
    ids: list[int], framing: int, content_chars: Sequence[int]
) -> ChatEncoding:
    """A chat's encoding split from its exact length, the length of its framing alone (the
    same chat with empty contents), and each content's characters: the contents share what
    the framing leaves in proportion to their characters (`estimated_encoding` spreads the
    framing)."""
    chars = sum(content_chars)
    density = max(0, len(ids) - framing) / chars if chars else 0.0
    contents = [round(c * density) for c in content_chars]
    return dataclasses.replace(estimated_encoding(ids, contents), tokens_per_char=density)


def _ids(answer: Mapping[str, Any]) -> list[int]:
    """The token ids of a `/tokenize` answer, checked: a list of ids, as many as its `count`
    says when it gives one."""
    ids = answer.get("tokens")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise EngineUnavailableError("The upstream's /tokenize sent no list of token ids.")
    count = answer.get("count")
    if count is not None and count != len(ids):
        raise EngineUnavailableError(
            f"The upstream's /tokenize counted {count} tokens but sent {len(ids)}."
        )
    return ids


async def tokenizer_for(
    config: UpstreamConfig, upstream: Upstream, model: str
) -> PromptTokenizer | None:
    """The configured local tokenizer, else the upstream's `/tokenize`, else none."""
    if config.tokenizer is not None:
        return await asyncio.to_thread(_local_tokenizer, config.tokenizer)
    remote = RemoteTokenizer(upstream.client, upstream.origin(), model)
    try:
        await remote.probe()
    except GatewayError as exc:
        logger.warning(
            "upstream %s has no usable /tokenize (%s) and SLUICEGATE_TOKENIZER is not set: "
            "the token budget is off for %s (no prompt fitting or max_tokens clamping; token "
            "counts come from the upstream's usage)",
            upstream.label,
            exc.message,
            model,
        )
        return None
    logger.info("token budget counts with the /tokenize of upstream %s", upstream.label)
    return remote


LOADING = threading.Lock()
"""Held while a pool loads its tokenizer or its reasoning parser in a thread: pools start
together, and transformers' lazy module, imported by two threads at once, fails one of them
(`cannot import name 'AutoTokenizer'`)."""


def _local_tokenizer(name: str) -> PromptTokenizer:
    """`name`'s tokenizer (a folder, or a hub id fetched when the hub is reachable), with
    transformers alone: upstream mode installs no vLLM (the `tokenizer` extra)."""
    with LOADING:
        from transformers import AutoTokenizer

        folder = Path(name).expanduser()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder) if folder.exists() else name)
            return HFPromptTokenizer(tokenizer)
        except (OSError, ValueError) as exc:
            raise UpstreamStartError(f"the tokenizer {name} cannot be loaded: {exc}") from exc
