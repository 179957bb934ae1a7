"""Cache keys: which runs may be cached, and the key that names everything that shapes the output.

A key is `<prefix>:cache:v1:<model>:<sha256>`. The digest covers the prompt token ids (the
messages after the chat template, or the prompt, so JSON key order and whitespace outside
strings cannot change it) or, where no tokenizer gave ids (an upstream without one), the
messages or text as canonical JSON; for an engine that renders chats itself, the
`tool_choice` it is sent; every sampling option with its default filled in (`max_tokens`
after the token budget, `stop`, `seed`, `n`, `logprobs` included), the endpoint, the model's
identity, and the caller's key id when entries are kept per key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from array import array
from typing import Literal

from sluicegate.engine.protocol import Prompt, SamplingOptions

KEY_VERSION = "v1"
_UNKEYED = frozenset({"pass_through"})
"""Options that say how the output is handed on, not what it is."""
_OPTION_FIELDS = tuple(
    f.name for f in dataclasses.fields(SamplingOptions) if f.name not in _UNKEYED
)
CachePolicy = Literal["off", "deterministic", "all"]


def is_cacheable(options: SamplingOptions, policy: CachePolicy) -> bool:
    """Whether the policy lets a run with these options be served from the cache."""
    if policy == "all":
        return True
    if policy == "off":
        return False
    return options.temperature == 0 or options.top_k == 1 or options.seed is not None


def cache_key(
    prefix: str,
    model_name: str,
    model_identity: str,
    endpoint: str,
    prompts: list[Prompt],
    options: SamplingOptions,
    namespace: str | None = None,
    shape: object = None,
) -> str:
    """`shape`: what the response adds to the engine's output, as JSON data (the prompts
    that completions `echo` puts first)."""
    header: list[object] = [
        KEY_VERSION,
        endpoint,
        model_identity,
        namespace,
        # Every field by name, so adding an option can never leave it out of the key.
        [(name, _plain(getattr(options, name))) for name in _OPTION_FIELDS],
        len(prompts),
    ]
    if shape is not None:  # so keys of runs without one stay what they were
        header.append(shape)
    digest = hashlib.sha256(json.dumps(header, separators=(",", ":")).encode())
    for prompt in prompts:
        # Length first, so prompt boundaries are part of what is hashed.
        digest.update(len(prompt.ids).to_bytes(4, "little"))
        digest.update(array("q", prompt.ids).tobytes())
        for image in prompt.images:
            # The image by its bytes' digest, never its URL (the same URL may give other
            # bytes); nothing is added without images, so text keys stay what they were.
            seen = f"image:{image.digest}:{image.detail or ''}".encode()
            digest.update(len(seen).to_bytes(4, "little"))
            digest.update(seen)
        if prompt.ids and prompt.chat is None:
            continue
        described = _described(prompt)
        digest.update(len(described).to_bytes(4, "little"))
        digest.update(described)
    return f"{prefix}:cache:{KEY_VERSION}:{model_name}:{digest.hexdigest()}"


def _described(prompt: Prompt) -> bytes:
    """What of the prompt the ids do not say, as canonical JSON: all of it without ids."""
    chat = prompt.chat
    described: dict[str, object] = {}
    if chat is not None:
        described["choice"] = [chat.tool_choice, chat.parallel_tool_calls]
        if not prompt.ids:
            described["messages"] = list(chat.messages)
            described["tools"] = list(chat.tools or ())
    elif not prompt.ids:
        described["text"] = prompt.text
    return json.dumps(described, sort_keys=True, separators=(",", ":")).encode()


def _plain(value: object) -> object:
    """An option as JSON can hold it (a nested constraint becomes its fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def lock_key(key: str) -> str:
    """The single-flight lock for a cache key."""
    return key + ":lock"
