"""vLLM's reasoning parsers behind our `ReasoningParser` protocol: the one place that knows them.

A parser is picked by name from vLLM's registry (`--reasoning-parser` in vLLM's server:
deepseek_r1, qwen3, step3, ...) and driven as vLLM's chat server drives it: one parser per
choice, composed by vLLM's `ParserManager` (reasoning only: tool calls are read later, from
the content, by `engine.tool_parser`), fed each delta's text and token ids, with the prompt's
ids on the first so that a prompt which already closed the thoughts makes the rest content.

vLLM's server feeds its parsers a token at a time, and its thinking parsers count on it: a
delta holding `<think>` and more leaves the marker in the thoughts. Ours come larger (an
upstream's events read together, an engine's outputs merged while the reader was busy), so
each delta is cut at the tokenizer's added tokens (the markers are among them) and each
marker fed alone: the split is the one a token at a time gives, however the output came.
vLLM is imported lazily: a gateway over upstreams never loads it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sluicegate.engine.protocol import ReasoningStream

logger = logging.getLogger(__name__)


class ReasoningParserError(Exception):
    """The configured parser cannot be used; one line for the operator."""


def reasoning_parser_names() -> list[str]:
    from vllm.reasoning import ReasoningParserManager

    return sorted(ReasoningParserManager.list_registered())


def load_reasoning_plugin(path: str) -> None:
    """Import a Python file that registers reasoning parsers with vLLM's
    `ReasoningParserManager` (vLLM's `--reasoning-parser-plugin`), so that their names are
    known here; `ReasoningParserError` if it cannot be imported."""
    # vLLM's own loader (`ReasoningParserManager.import_reasoning_parser`) logs a file that
    # fails and goes on: imported here, its failure stops start-up with its cause.
    from vllm.utils.import_utils import import_from_path

    file = Path(path)
    if not file.is_file():
        raise ReasoningParserError(f"the reasoning parser plugin {path} is no file")
    try:
        import_from_path(f"sluicegate_reasoning_plugin_{file.stem}", file)
    except Exception as exc:  # the plugin's own code: anything may come out of it
        raise ReasoningParserError(
            f"the reasoning parser plugin {path} failed to load: {exc.__class__.__name__}: {exc}"
        ) from None


def check_reasoning_parser(name: str, plugin: str | None = None) -> None:
    """Raise `ReasoningParserError`, listing the known names, unless vLLM has `name` (with
    the parsers `plugin` registers, loaded first)."""
    if plugin is not None:
        load_reasoning_plugin(plugin)
    known = reasoning_parser_names()
    if name not in known:
        raise ReasoningParserError(f"unknown reasoning parser {name!r} (known: {', '.join(known)})")


class VLLMReasoningParser:
    """`ReasoningParser` over one of vLLM's registered reasoning parsers."""

    def __init__(
        self,
        name: str,
        tokenizer: Any,
        model_config: Any = None,
        *,
        encodes_text: bool = False,
        plugin: str | None = None,
    ):
        """`tokenizer` is the model's (vLLM's `get_tokenizer`); `model_config` vLLM's, when
        there is an engine (parsers read the model's settings from it). `encodes_text`: the
        deltas come as text alone (an upstream's), and their ids are the tokenizer's encoding
        of it: the thinking markers are single tokens, which their text encodes to. `plugin`:
        a file registering more parsers, loaded first (`load_reasoning_plugin`)."""
        from vllm.parser import ParserManager

        check_reasoning_parser(name, plugin)
        hf_config = getattr(model_config, "hf_config", None)
        if getattr(hf_config, "model_type", None) == "gpt_oss":
            # Its thoughts are channels of the Harmony format, which needs vLLM's own
            # Harmony renderer, not a parse of the text.
            raise ReasoningParserError(
                "reasoning parsers are not supported for Harmony (gpt-oss) models"
            )
        try:
            cls = ParserManager.get_parser(
                reasoning_parser_name=name,
                model_name=getattr(model_config, "model", None),
                tokenizer=tokenizer,
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            # The tokenizer lacks the parser's markers (`</think>`, ...).
            raise ReasoningParserError(
                f"reasoning parser {name!r} cannot be used with this model: {exc}"
            ) from None
        assert cls is not None  # a name was given
        self.name = name
        self._cls: Any = cls
        self._tokenizer = tokenizer
        self._model_config = model_config
        self._request = _request()
        self._encode: Callable[[str], list[int]] | None = None
        if encodes_text:
            self._encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))
        self._markers = _Markers(dict(tokenizer.get_added_vocab()))
        # A parser without state, for the questions asked of prompts alone.
        self._probe: Any = self._parser({})

    def stream(
        self, prompt_ids: Sequence[int], template_kwargs: Mapping[str, Any]
    ) -> ReasoningStream:
        return _Stream(
            self._parser(template_kwargs),
            self._request,
            prompt_ids,
            self.name,
            self._markers,
            self._encode,
        )

    def prompt_ends_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt already closed the thoughts (a template turning thinking off
        writes an empty think block): the output is then all answer, and structured
        outputs constrain it from its first token."""
        try:
            return bool(self._probe.is_reasoning_end(list(prompt_ids)))
        except Exception:  # a parser's bug must not refuse the request
            logger.exception("reasoning parser %s failed on a prompt", self.name)
            return False

    def _parser(self, template_kwargs: Mapping[str, Any]) -> Any:
        return self._cls(
            self._tokenizer,
            None,
            chat_template_kwargs=dict(template_kwargs),
            model_config=self._model_config,
        )


class _Stream:
    """One choice's parser. A parser that raises ends the split for the choice (what follows
    is content), never the answer."""

    def __init__(
        self,
        parser: Any,
        request: Any,
        prompt_ids: Sequence[int],
        name: str,
        markers: _Markers,
        encode: Callable[[str], list[int]] | None = None,
    ):
        self._encode = encode
        self._markers = markers
        self._parser = parser
        self._request = request
        self._prompt: list[int] | None = list(prompt_ids)
        self._name = name
        self._ids: list[int] = []
        self._failed = False

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str, str]:
        if self._failed:
            return "", text
        ids = list(token_ids)
        if ids or self._encode is None:
            pieces = self._markers.cut(text, ids)
        else:
            pieces = self._encoded(text)
        reasoning, content = [], []
        for i, (piece, piece_ids) in enumerate(pieces):
            thought, answer = self._feed(piece, piece_ids, finished and i == len(pieces) - 1)
            reasoning.append(thought)
            content.append(answer)
        return "".join(reasoning), "".join(content)

    def _encoded(self, text: str) -> list[tuple[str, list[int]]]:
        """An upstream's text cut at the markers, each piece with its encoding."""
        assert self._encode is not None
        pieces = self._markers.cut(text, [])
        try:
            return [(piece, self._encode(piece)) for piece, _ in pieces]
        except Exception:
            logger.exception("tokenizer failed for reasoning parser %s", self._name)
            self._failed = True
            return [(text, [])]

    def _feed(self, text: str, ids: list[int], finished: bool) -> tuple[str, str]:
        self._ids.extend(ids)
        if self._failed:
            return "", text
        # vLLM's server skips the empty outputs of a prefill in parts; so do we.
        if not text and not ids and not finished:
            return "", ""
        prompt, self._prompt = self._prompt, None
        try:
            delta = self._parser.parse_delta(text, ids, self._request, prompt, finished=finished)
        except Exception:
            logger.exception("reasoning parser %s failed; the rest is content", self._name)
            self._failed = True
            return "", text
        if delta is None:
            return "", ""
        return delta.reasoning or "", delta.content or ""

    def count(self) -> int:
        try:
            return int(self._parser.count_reasoning_tokens(self._ids))
        except Exception:
            logger.exception("reasoning parser %s failed to count", self._name)
            return 0


class _Markers:
    """The tokenizer's added tokens (`<think>`, `</think>`, the chat's own markers), where a
    delta is cut so that each reaches the parser alone."""

    def __init__(self, added: Mapping[str, int]):
        self._by_text = dict(added)
        self._ids = {token_id: text for text, token_id in added.items()}
        texts = sorted(added, key=len, reverse=True)
        self._pattern = re.compile("(" + "|".join(map(re.escape, texts)) + ")") if texts else None

    def cut(self, text: str, ids: list[int]) -> list[tuple[str, list[int]]]:
        """`text` (made of `ids`, or of no ids known yet) as pieces, each marker one of them,
        in order; whole when it holds no marker or its markers are not those of its ids (a
        marker the detokenizer left out of the text)."""
        if self._pattern is None:
            return [(text, ids)]
        if ids and not any(token_id in self._ids for token_id in ids):
            return [(text, ids)]
        if not ids and self._pattern.search(text) is None:
            return [(text, ids)]
        texts = self._pattern.split(text)  # between, marker, between, ..., between
        if not ids:
            return [(piece, []) for piece in texts if piece]
        runs: list[list[int]] = [[]]
        marks: list[str] = []
        for token_id in ids:
            if token_id in self._ids:
                marks.append(self._ids[token_id])
                runs.append([])
            else:
                runs[-1].append(token_id)
        if marks != texts[1::2]:
            return [(text, ids)]
        pieces: list[tuple[str, list[int]]] = []
        for i, between in enumerate(texts[::2]):
            if i:
                mark = marks[i - 1]
                pieces.append((mark, [self._by_text[mark]]))
            if between or runs[i]:
                pieces.append((between, runs[i]))
        return pieces


def _request() -> Any:
    """The request vLLM's parsers are handed: they read `include_reasoning` and the tools
    from it. Thoughts are always split here (the chat format leaves them out when the
    client asked so), and tool calls are not the reasoning parser's."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate(
        {"model": "", "messages": [], "include_reasoning": True}
    )
