"""A pool's own reasoning parser, for upstreams that send their thoughts inside the content.

vLLM's server with `--reasoning-parser` and llama.cpp's with its default reasoning format split
the thoughts themselves (`reasoning`, `reasoning_content`), and the reader keeps their split.
An upstream that does not (vLLM without a parser, llama.cpp with `--reasoning-format none`, a
server that knows nothing of thinking) sends `<think>...</think>` in the content: with the
models file's `reasoning_parser:` (or REASONING_PARSER with UPSTREAM_URLS) the gateway splits
it with vLLM's own parser, over the pool's local tokenizer, as vLLM's server would.
"""

from __future__ import annotations

from sluicegate.engine.protocol import PromptTokenizer, ReasoningParser
from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.engine.upstream.discovery import UpstreamStartError
from sluicegate.engine.upstream.tokenizer import LOADING


def gateway_reasoning_parser(
    name: str, tokenizer: PromptTokenizer | None, plugin: str | None = None
) -> ReasoningParser:
    """vLLM's parser `name` over the pool's local tokenizer; `UpstreamStartError` when it
    cannot be had (no local tokenizer, no vLLM installed, an unknown name, a tokenizer without
    the parser's markers). `plugin`: a file registering more parsers, loaded first. Loads
    vLLM: call it off the event loop."""
    if not isinstance(tokenizer, HFPromptTokenizer):
        raise UpstreamStartError(
            f"reasoning parser {name!r} needs the model's own tokenizer (`tokenizer:` in the "
            "models file, SLUICEGATE_TOKENIZER with UPSTREAM_URLS)"
        )
    try:
        with LOADING:
            from sluicegate.engine.reasoning_parser import (
                ReasoningParserError,
                VLLMReasoningParser,
            )

            return VLLMReasoningParser(
                name, tokenizer.hf_tokenizer, encodes_text=True, plugin=plugin
            )
    except ImportError as exc:
        raise UpstreamStartError(
            f"reasoning parser {name!r} is vLLM's: install the `cpu` or `gpu` extra ({exc})"
        ) from None
    except ReasoningParserError as exc:
        raise UpstreamStartError(str(exc)) from None
