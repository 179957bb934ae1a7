"""`/tokenize` and `/detokenize`: the model's tokenizer, as vLLM's server exposes it.

Tokenizing long text runs off the event loop (`engine.tokenizer`); a text longer than any
prompt the model could take is refused before it is tokenized, so one request cannot ask for
an answer of millions of ids.
"""

from __future__ import annotations

from typing import Any

from sluicegate.engine.protocol import (
    MAX_TOKEN_CHARS,
    EmbeddingEngine,
    EngineClient,
    PromptTokenizer,
)
from sluicegate.errors import InvalidRequestError
from sluicegate.wire.tokenize import DetokenizeRequest, TokenizeRequest


class TokenizationService:
    def __init__(self, engine: EngineClient | EmbeddingEngine):
        """The tokenizer of `engine`: the registry has resolved the request's model to it."""
        self._engine = engine

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        """vLLM's `TokenizeResponse`: count, max_model_len, tokens, token_strs."""
        tokenizer = self._tokenizer()
        if request.messages is not None:
            for i, message in enumerate(request.messages):
                if isinstance(message.content, list) and message.has_images():
                    j = next(j for j, p in enumerate(message.content) if p.type == "image_url")
                    raise InvalidRequestError(
                        "/tokenize counts text only: send the conversation without its "
                        "images (a chat answer's usage counts them)",
                        param=f"messages.{i}.content.{j}",
                    )
            param = "messages"
            text = await tokenizer.render_chat(
                request.prompt_messages(),
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=request.chat_template_kwargs,
            )
        else:
            param, text = "prompt", request.prompt or ""
        self._check_length(text, param)
        tokenized = await tokenizer.tokenize(
            text, add_special_tokens=request.special_tokens, with_strings=request.return_token_strs
        )
        return {
            "count": len(tokenized.ids),
            "max_model_len": self._engine.max_model_len,
            "tokens": tokenized.ids,
            "token_strs": tokenized.strings,
        }

    async def detokenize(self, request: DetokenizeRequest) -> dict[str, str]:
        """vLLM's `DetokenizeResponse`: the ids' text, special tokens kept."""
        tokenizer = self._tokenizer()
        # No sequence this model can hold is longer; unbounded, 2,000,000 ids held the
        # GIL for 0.5 to 0.9 s in the decode.
        longest = self._engine.max_model_len
        if len(request.tokens) > longest:
            raise InvalidRequestError(
                f"At most {longest} token ids (this model's context length) are accepted; "
                f"{len(request.tokens)} were sent.",
                param="tokens",
            )
        vocab = tokenizer.vocab_size
        outside = next((t for t in request.tokens if t >= vocab), None)
        if outside is not None:
            raise InvalidRequestError(
                f"token ids must be in [0, {vocab}); {outside} is not.", param="tokens"
            )
        return {"prompt": await tokenizer.decode(request.tokens)}

    def _tokenizer(self) -> PromptTokenizer:
        tokenizer = self._engine.tokenizer
        if tokenizer is None:
            raise InvalidRequestError(
                "This gateway has no tokenizer for this model: its upstreams have no /tokenize "
                "and no tokenizer is configured for it (SLUICEGATE_TOKENIZER, or `tokenizer` "
                "in the models file)."
            )
        return tokenizer

    def _check_length(self, text: str, param: str) -> None:
        longest = MAX_TOKEN_CHARS * self._engine.max_model_len
        if len(text) > longest:
            raise InvalidRequestError(
                f"The text to tokenize has {len(text)} characters, more than any prompt of "
                f"this model ({self._engine.max_model_len} tokens) can hold; at most "
                f"{longest} are accepted.",
                param=param,
            )
