"""Prompt tokenization with the model's own tokenizer and chat template.

Short inputs are encoded inline: a thread hop would cost more than the work. Long ones go to
a single worker thread, so a 100k-character prompt never stalls the event loop. (Hugging
Face's fast tokenizers release the GIL while they encode, so the loop keeps running.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from sluicegate.engine.protocol import (
    MAX_TOKEN_CHARS,
    ChatEncoding,
    ChatMessages,
    TemplateKwargs,
    Tokenized,
    Tools,
)
from sluicegate.errors import InvalidRequestError
from sluicegate.lru import BoundedLRU

T = TypeVar("T")
R = TypeVar("R")

# Characters above which encoding moves off the event loop (~0.2 ms of work inline).
INLINE_LIMIT_CHARS = 2048
# What one message weighs beside its text, in characters: rendering the template for many
# short messages is work too.
MESSAGE_WEIGHT_CHARS = 64
COUNT_BATCH = 2048
COUNT_BATCH_CHARS = 256 * 1024
"""Texts counted in one call to the tokenizer's core, at most (and at most this many
characters, but for one longer text alone): its encodings are made without the GIL, but
turned into Python objects and freed with it, for as long as they are large."""
# In a prompt that cannot fit, contents longer than this are bounded by their length, not
# tokenized (`_bounded_encoding`).
BOUNDED_CONTENT_CHARS = 64 * 1024
# Bounds of the memo of recent chat encodings.
MEMO_MAX_ENTRIES = 2048
MEMO_MAX_CHARS = 8 * 1024 * 1024  # about 2M tokens held, some 20 MiB with their lists


class HFPromptTokenizer:
    """`PromptTokenizer` over a Hugging Face tokenizer (what vLLM's `get_tokenizer` returns)."""

    def __init__(
        self,
        tokenizer: Any,
        inline_limit_chars: int = INLINE_LIMIT_CHARS,
        chat_template: str | None = None,
        images: ImageTemplate | None = None,
    ):
        """`chat_template` (Jinja text) replaces the model's own. `images`: how the template
        takes a message's images (a model that reads them); None: a message's text alone is
        rendered (a count of an upstream's prompt, whose images are estimated)."""
        self._tokenizer = tokenizer
        self._template = chat_template
        self._images = images
        self._inline_limit = inline_limit_chars
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        # A fast tokenizer's Rust core, called directly where only lengths and offsets are
        # needed: Hugging Face's wrapper would convert every encoding to Python lists first.
        self._backend = (
            getattr(tokenizer, "backend_tokenizer", None)
            if getattr(tokenizer, "is_fast", False)
            else None
        )
        if not chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template")
        self._variables: frozenset[str] | None = None
        # Repeated conversations (retries, agents, cache hits) skip the template and encoding.
        self._memo: BoundedLRU[tuple[object, ...], ChatEncoding] = BoundedLRU(
            MEMO_MAX_ENTRIES, MEMO_MAX_CHARS
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    @property
    def images(self) -> ImageTemplate | None:
        """How the template takes images; None: it is given a message's text alone."""
        return self._images

    @property
    def hf_tokenizer(self) -> Any:
        """The Hugging Face tokenizer itself (what vLLM's parsers take)."""
        return self._tokenizer

    async def encode_chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        size = _chat_size(messages, tools)
        return await self._run(size, self._encode_chat_sync, messages, tools, template_kwargs)

    async def encode_chat_counted(
        self,
        messages: ChatMessages,
        ids_up_to: int | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        template_kwargs = self.template_arguments(template_kwargs)
        key = _memo_key(messages, tools, template_kwargs)
        found = self._memo.get(key)
        if found is not None:
            # A list of its own: the ids become the run's prompt.
            return dataclasses.replace(found, ids=list(found.ids))
        size = _chat_size(messages, tools)
        encoding = await self._run(
            size, self._encode_chat_counted_sync, messages, ids_up_to, tools, template_kwargs
        )
        if size <= MEMO_MAX_CHARS and encoding.length == len(encoding.ids):
            self._memo.put(key, dataclasses.replace(encoding, ids=list(encoding.ids)), size)
        return encoding

    async def encode(self, text: str) -> list[int]:
        return await self._run(len(text), self._encode_sync, text)

    async def count(self, texts: Sequence[str]) -> list[int]:
        size = sum(len(t) for t in texts) + MESSAGE_WEIGHT_CHARS * len(texts)
        return await self._run(size, self._count_sync, texts)

    async def tokenize(
        self, text: str, add_special_tokens: bool = True, with_strings: bool = False
    ) -> Tokenized:
        return await self._run(
            len(text), self._tokenize_sync, text, add_special_tokens, with_strings
        )

    async def render_chat(
        self,
        messages: ChatMessages,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> str:
        return await self._run(
            _chat_size(messages),
            self.render,
            messages,
            None,
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
        )

    async def decode(self, token_ids: Sequence[int]) -> str:
        # Decoding costs about what encoding does per token; a token is a few characters.
        return await self._run(4 * len(token_ids), self._decode_sync, token_ids)

    def _decode_sync(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids)))

    def _tokenize_sync(self, text: str, add_special_tokens: bool, with_strings: bool) -> Tokenized:
        ids = list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))
        strings = None
        if with_strings:
            strings = [str(s) for s in self._tokenizer.convert_ids_to_tokens(ids)]
        return Tokenized(ids, strings)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def template_arguments(self, template_kwargs: TemplateKwargs | None) -> dict[str, Any]:
        """Those of `template_kwargs` the chat template reads, as vLLM's server keeps them
        (`resolve_chat_template_kwargs`): a model whose template knows no `enable_thinking`
        renders the same prompt, and memoizes it once, whatever the client sends."""
        if not template_kwargs:
            return {}
        if self._variables is None:
            self._variables = _template_variables(
                self._template or getattr(self._tokenizer, "chat_template", None)
            )
        variables = self._variables
        return {k: v for k, v in template_kwargs.items() if not variables or k in variables}

    def render(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> str:
        """The prompt text: the chat template applied (with a generation prompt by default).

        A conversation the template refuses (its `raise_exception`, e.g. "only one tool call
        per message") is an `InvalidRequestError` on `messages`; one that fails on the
        client's `template_kwargs` (a string added to a number) on those, as vLLM's server
        refuses whatever a template raises."""
        from jinja2 import TemplateError

        arguments = self.template_arguments(template_kwargs)
        try:
            return str(
                self._tokenizer.apply_chat_template(
                    _template_messages(messages, self._images),
                    tools=[dict(t) for t in tools] if tools else None,
                    chat_template=self._template,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                    **arguments,
                )
            )
        except TemplateError as exc:
            raise InvalidRequestError(
                f"The model's chat template cannot render this conversation: {exc}",
                param="messages",
            ) from None
        except Exception as exc:
            if not arguments:
                raise
            raise InvalidRequestError(
                f"The model's chat template cannot render with these chat_template_kwargs: "
                f"{type(exc).__name__}: {exc}",
                param="chat_template_kwargs",
            ) from None

    def _encode_chat_sync(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        # Same two steps as vLLM's server: render the template to text, then tokenize it
        # without adding special tokens again (the template already has them).
        return self._encode_rendered(self.render(messages, tools, template_kwargs=template_kwargs))

    def _encode_rendered(self, text: str) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _encode_chat_counted_sync(
        self,
        messages: ChatMessages,
        ids_up_to: int | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        text = self.render(messages, tools, template_kwargs=template_kwargs)
        if ids_up_to is not None and len(text) > MAX_TOKEN_CHARS * max(ids_up_to, 1):
            return self._bounded_encoding(messages, tools, template_kwargs)
        contents = [m["content"] for m in messages]
        spans = content_spans(text, contents)
        if spans is None or self._backend is None:
            return estimated_encoding(self._encode_rendered(text), self._count_sync(contents))
        encoding = self._backend.encode_batch([text], add_special_tokens=False)[0]
        length = len(encoding)
        ids = encoding.ids if ids_up_to is None or length <= ids_up_to else []
        return attributed_encoding(ids, tokens_before(encoding, len(text)), spans, length)

    def _bounded_encoding(
        self,
        messages: ChatMessages,
        tools: Tools | None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        """The counts of a prompt too long to fit by its characters alone, without tokenizing
        megabytes: an encoding of millions of tokens takes seconds to make and, when it is
        freed, tens of milliseconds holding the GIL. Contents longer than
        `BOUNDED_CONTENT_CHARS` count as their UTF-8 length, an upper bound (no token is
        shorter than a byte); the others and the template's framing are counted exactly."""
        contents = [m["content"] for m in messages]
        # An assistant turn's thoughts are text the template writes too: bounded alike.
        thoughts = [_reasoning(m) for m in messages]
        texts = contents + thoughts
        counted = [i for i, c in enumerate(texts) if c and len(c) <= BOUNDED_CONTENT_CHARS]
        exact = dict(zip(counted, self._count_sync([texts[i] for i in counted]), strict=True))
        sizes = [
            exact.get(i) or len(t.encode("utf-8", "surrogatepass")) for i, t in enumerate(texts)
        ]
        counts = [
            sizes[i]
            # A message's tool calls count as their JSON's length, an upper bound too.
            + _calls_size(m)
            for i, m in enumerate(messages)
        ]
        thought_counts = sizes[len(messages) :]
        empty = [_without_text(m) for m in messages]
        framing = len(
            self._encode_rendered(self.render(empty, tools, template_kwargs=template_kwargs))
        )
        per_message = framing // (len(messages) + 1)
        return ChatEncoding(
            [],
            tuple(c + t + per_message for c, t in zip(counts, thought_counts, strict=True)),
            tuple(counts),
            framing + sum(counts) + sum(thought_counts),
        )

    def _encode_sync(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))

    def _count_sync(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        if self._backend is not None:
            # In batches: turning one batch's encodings into Python objects holds the GIL,
            # and so the event loop, for as long as the batch is large.
            counts: list[int] = []
            for batch in count_batches(texts):
                encodings = self._backend.encode_batch(batch, add_special_tokens=False)
                counts.extend(len(e) for e in encodings)
                del encodings
            return counts
        return [
            len(ids) for ids in self._tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        ]

    async def _run(self, size: int, fn: Callable[..., R], *args: Any) -> R:
        if size <= self._inline_limit:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)


def count_batches(texts: Sequence[str]) -> Iterator[list[str]]:
    """`texts` in order, in batches of at most `COUNT_BATCH` texts and `COUNT_BATCH_CHARS`
    characters (a longer text in a batch of its own)."""
    batch: list[str] = []
    chars = 0
    for text in texts:
        if batch and (len(batch) == COUNT_BATCH or chars + len(text) > COUNT_BATCH_CHARS):
            yield batch
            batch, chars = [], 0
        batch.append(text)
        chars += len(text)
    if batch:
        yield batch


def _chat_size(messages: ChatMessages, tools: Tools | None = None) -> int:
    size = sum(len(m["content"]) for m in messages) + MESSAGE_WEIGHT_CHARS * len(messages)
    # Thoughts of earlier turns, under both their names (a template may write either).
    size += sum(2 * len(_reasoning(m)) for m in messages if len(m) > 2)
    # Tools (up to `max_tools_bytes`) and tool calls (their arguments may be megabytes) are
    # rendered as JSON: weigh them as such.
    tools_size = len(json.dumps(list(tools), ensure_ascii=False)) if tools else 0
    return size + tools_size + sum(_calls_size(m) for m in messages)


def _calls_size(message: Mapping[str, Any]) -> int:
    """Characters of the message's tool calls as ASCII JSON: no fewer than their tokens (a
    token is at least a byte; an escape is six characters for at most four bytes)."""
    calls = message.get("tool_calls")
    return len(json.dumps(calls)) if calls else 0


def _reasoning(message: Mapping[str, Any]) -> str:
    """An assistant turn's thoughts (`reasoning`, or its other name), or ""."""
    thought = message.get("reasoning") or message.get("reasoning_content")
    return thought if isinstance(thought, str) else ""


@dataclasses.dataclass(frozen=True, slots=True)
class ImageTemplate:
    """How a model's chat template takes a message's images (vLLM's content format)."""

    format: Literal["openai", "string"]
    """"openai": every message's content as parts (text as text parts), the template places
    each `{"type": "image"}` itself; "string": content as text, with the placeholders of
    its images first, as vLLM's server puts them."""
    placeholders: tuple[str, ...]
    """The model's text for the n-th image of a conversation (`<image>` for Idefics3,
    `<|image_1|>`, `<|image_2|>`, ... for others): the first `max_images`."""


def _template_messages(
    messages: ChatMessages, images: ImageTemplate | None
) -> list[dict[str, Any]]:
    rendered = [_both_reasoning_names(m) for m in messages]
    if images is None:
        for message in rendered:
            message.pop("parts", None)
        return rendered
    seen = 0
    for message in rendered:
        seen += _with_images(message, images, seen)
    return rendered


def _with_images(message: dict[str, Any], images: ImageTemplate, seen: int) -> int:
    """The message as the template takes it (as vLLM's renderer gives it), its images
    numbered after the `seen` ones before; how many it has."""
    parts = message.pop("parts", None)
    if images.format == "openai":
        if parts is not None:
            message["content"] = parts
        elif message["role"] != "tool":  # vLLM hands tool results on as text
            text = message.get("content")
            message["content"] = [] if text is None else [{"type": "text", "text": text}]
        return 0 if parts is None else sum(1 for part in parts if part["type"] == "image")
    if parts is None:
        return 0
    count = sum(1 for part in parts if part["type"] == "image")
    texts = "\n".join(part["text"] for part in parts if part["type"] == "text")
    last = len(images.placeholders) - 1  # the images past the bound are refused anyway
    wanted = Counter(images.placeholders[min(seen + k, last)] for k in range(count))
    missing: list[str] = []
    for placeholder, number in wanted.items():
        # Placeholders the client wrote into the text stand for images, as vLLM's do.
        left = number - texts.count(placeholder)
        if left < 0:
            raise InvalidRequestError(
                f"The messages hold more {placeholder!r} placeholders than images.",
                param="messages",
            )
        missing += [placeholder] * left
    message["content"] = "\n".join([*missing, texts] if texts else missing)
    return count


def _both_reasoning_names(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as templates take it: an assistant's thoughts under both names, as vLLM's
    renderer gives them (templates read one or the other)."""
    copy = dict(message)
    thought = _reasoning(message)
    if thought or "reasoning" in message or "reasoning_content" in message:
        copy["reasoning"] = copy["reasoning_content"] = thought
    return copy


def _template_variables(template: object) -> frozenset[str]:
    """The names a Jinja chat template reads from outside: the arguments it takes. Empty
    when unknown (a template per name, one that does not parse): then every argument goes."""
    if not isinstance(template, str):
        return frozenset()
    import jinja2
    import jinja2.meta
    import jinja2.sandbox

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        extensions=["jinja2.ext.loopcontrols"]
    )
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(template)))
    except jinja2.TemplateError:
        return frozenset()


def _without_text(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message with no content, thoughts or call arguments: what the template adds
    around them (`_bounded_encoding`)."""
    blank = {**message, "content": ""}
    if "parts" in message:
        blank["parts"] = [part for part in message["parts"] if part["type"] != "text"]
    for name in ("reasoning", "reasoning_content"):
        if name in message:
            blank[name] = ""
    if message.get("tool_calls"):
        blank["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": {}}}
            for call in message["tool_calls"]
        ]
    return blank


def _memo_key(
    messages: ChatMessages, tools: Tools | None, template_kwargs: TemplateKwargs | None = None
) -> tuple[object, ...]:
    """Everything the template renders: roles and contents, the other fields (tool fields,
    reasoning; as JSON, only where a message has them), the tools and the template's
    keyword arguments."""
    parts: list[object] = [
        (m["role"], m["content"], _extra(m) if len(m) > 2 else None) for m in messages
    ]
    if tools:
        parts.append(json.dumps(list(tools), sort_keys=True, ensure_ascii=False))
    if template_kwargs:
        parts.append(("kwargs", json.dumps(dict(template_kwargs), sort_keys=True)))
    return tuple(parts)


def _extra(message: Mapping[str, Any]) -> str:
    extra = {k: v for k, v in message.items() if k not in ("role", "content")}
    return json.dumps(extra, sort_keys=True, ensure_ascii=False)


def content_spans(text: str, contents: Sequence[str]) -> list[tuple[int, int]] | None:
    """Where each content sits in the rendered prompt, found in order; None if one is not."""
    spans: list[tuple[int, int]] = []
    position = 0
    for content in contents:
        at = text.find(content, position) if content else position
        if at < 0:  # templates that trim contents
            content = content.strip()
            at = text.find(content, position)
            if at < 0:
                return None
        position = at + len(content)
        spans.append((at, position))
    return spans


def tokens_before(encoding: Any, text_length: int) -> Callable[[int], int]:
    """`count(position)`: how many tokens of `encoding` start before that character.

    Asks the Rust encoding about the one token at the position, instead of building the list
    of every token's offsets: for a prompt of megabytes that list alone takes a third of a
    second, all of it holding the GIL (and so the event loop)."""
    tokens = len(encoding)

    def count(position: int) -> int:
        while position < text_length:
            index = encoding.char_to_token(position)
            if index is not None:
                start, _ = encoding.token_to_chars(index)
                return int(index) if start >= position else int(index) + 1
            position += 1  # a character no token covers: the next one tells
        return tokens

    return count


def attributed_encoding(
    ids: list[int],
    tokens_before: Callable[[int], int],
    spans: Sequence[tuple[int, int]],
    length: int = -1,
) -> ChatEncoding:
    """Each token goes to the message whose content it starts in, or whose framing precedes.
    `tokens_before(position)` counts the tokens that start before a character."""
    message_tokens: list[int] = []
    content_tokens: list[int] = []
    previous_end = 0
    for start, end in spans:
        first, last = tokens_before(start), tokens_before(end)
        message_tokens.append(last - previous_end)
        content_tokens.append(last - first)
        previous_end = last
    return ChatEncoding(ids, tuple(message_tokens), tuple(content_tokens), length)


def estimated_encoding(ids: list[int], content_counts: Sequence[int]) -> ChatEncoding:
    """Contents counted alone, the template's framing spread evenly over the messages."""
    framing = max(0, len(ids) - sum(content_counts)) // (len(content_counts) + 1)
    return ChatEncoding(ids, tuple(c + framing for c in content_counts), tuple(content_counts))
