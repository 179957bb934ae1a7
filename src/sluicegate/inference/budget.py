"""The token budget: exact prompt counts, the max_tokens a request gets, and fitting the
prompt into the context window.

A request is counted with the model's own tokenizer, after its chat template, and those ids
are what the engine receives. The completion always keeps room for `min_completion_tokens`
(or the client's smaller `max_tokens`); when the prompt leaves less, it is truncated
(`inference.truncation` for chats; for text prompts, the start is cut and the end kept) or, with
truncation disabled, refused. Then, with budget = context − prompt:

- no `max_tokens` from the client: budget × (1 − reserve_ratio), at most `default_max_tokens`;
- a `max_tokens` above the budget: clamped to it, or a 400 when `overflow` is "error".

Every fitted request carries a `BudgetReport`, sent back as `X-Budget-*` headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from sluicegate.engine.protocol import (
    MAX_TOKEN_CHARS,
    ChatMessages,
    PromptTokenizer,
    TemplateKwargs,
    Tools,
)
from sluicegate.errors import ContextLengthExceededError
from sluicegate.inference.truncation import TruncatedChat, truncate_chat
from sluicegate.observability.metrics import (
    BUDGET_CLAMPED_MAX_TOKENS,
    BUDGET_DROPPED_TOKENS,
    BUDGET_TRIMMED_REQUESTS,
)
from sluicegate.wire.requests import Overflow, Truncation

MaxTokensSource = Literal["client", "clamped", "default"]
ImageCost = Callable[[], Awaitable[tuple[int, bool]]]
"""What a chat's images add to its prompt, and whether exactly (`inference.images`)."""


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """How requests are fitted; the `budget_*`, `truncation` and overflow settings."""

    reserve_ratio: float = 0.3
    default_max_tokens: int = 4096
    min_completion_tokens: int = 16
    overflow: Overflow = "clamp"
    chat_truncation: Truncation = "auto"
    completion_truncation: Truncation = "disabled"


BUDGET_HEADERS = (
    "X-Budget-Prompt-Tokens-Before",
    "X-Budget-Prompt-Tokens-After",
    "X-Budget-Messages-Dropped",
    "X-Budget-Truncation",
    "X-Budget-Max-Tokens",
    "X-Budget-Max-Tokens-Source",
)
"""The headers that say what the token budget did (`BudgetReport.headers`)."""


@dataclass(frozen=True, slots=True)
class BudgetReport:
    """What the budget did to a request; for a batch of prompts, token counts are sums."""

    prompt_tokens_before: int
    prompt_tokens_after: int
    max_tokens: int
    max_tokens_source: MaxTokensSource
    messages_dropped: int = 0
    steps: tuple[str, ...] = ()
    truncated: TruncatedChat | None = field(default=None, compare=False, repr=False)
    """The chat as truncation left it (which messages stayed, their contents), when it cut
    anything: what the prompt holds, so what a stored response keeps (`api.responses`)."""

    @property
    def trimmed(self) -> bool:
        return bool(self.steps)

    def headers(self) -> dict[str, str]:
        values = (
            self.prompt_tokens_before,
            self.prompt_tokens_after,
            self.messages_dropped,
            ",".join(self.steps) or "none",
            self.max_tokens,
            self.max_tokens_source,
        )
        return {name: str(value) for name, value in zip(BUDGET_HEADERS, values, strict=True)}


@dataclass(frozen=True, slots=True)
class FittedPrompts:
    prompts: list[list[int]]
    max_tokens: int
    report: BudgetReport | None
    """None: nothing was fitted (no tokenizer)."""
    messages: ChatMessages | None = None
    """A chat's messages as fitted (older turns may be gone), for engines that render it."""


class TokenBudget:
    """Fits requests to one model's context window."""

    def __init__(self, tokenizer: PromptTokenizer, max_model_len: int, policy: BudgetPolicy):
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._policy = policy

    async def fit_chat(
        self,
        messages: ChatMessages,
        *,
        max_tokens: int | None,
        min_tokens: int = 0,
        truncation: Truncation | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
        image_tokens: ImageCost | None = None,
    ) -> FittedPrompts:
        """The chat prompt's ids, truncated to fit if allowed, and the max_tokens to use.

        `tools` are rendered into the prompt and counted; truncation never removes them.
        `template_kwargs` go to the chat template at every rendering. `image_tokens`: what
        the chat's images add to its ids and whether exactly, asked once its text fits (its
        images are read for it). A chat with images fits whole or is refused, never
        truncated; an estimate alone refuses nothing (the completion gets what the text
        leaves, at least its minimum: the engine counts)."""
        ask = _Ask(max_tokens, min_tokens, "messages")
        limit = self._prompt_limit(ask)
        encoding = await self._tokenizer.encode_chat_counted(
            messages, ids_up_to=limit, tools=tools, template_kwargs=template_kwargs
        )
        extra, exact = 0, True
        if image_tokens is not None:
            if encoding.length > limit:
                self._refuse_images(encoding.length, limit, None)
            extra, exact = await image_tokens()
        before = encoding.length + extra
        if before <= limit:
            return self._fitted([encoding.ids], before, ask, messages=messages, extra=extra)
        if extra and not exact:
            counted = limit - encoding.length
            return self._fitted([encoding.ids], before, ask, messages=messages, extra=counted)
        if extra:
            self._refuse_images(before, limit, extra)
        # Truncation off, or the completion alone asking for the whole context: a 400.
        if (truncation or self._policy.chat_truncation) == "disabled" or limit <= 0:
            self._check_fits(before, limit, ask.param)
        result = await truncate_chat(
            self._tokenizer, messages, encoding, limit, tools, template_kwargs
        )
        after = len(result.ids)
        if after > limit and ask.insists(self._policy):
            self._check_fits(before, limit, ask.param)
        if after > limit:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self._max_model_len} tokens and the "
                f"completion needs at least {self._max_model_len - limit} of them. However, "
                f"the messages take {before} tokens, and still {after} with every older turn "
                f"removed: the last user message alone does not fit in {limit} tokens"
                + (" beside the tools, which are always kept" if tools else "")
                + ". Please reduce the length of the messages"
                + (" or the tools." if tools else "."),
                param="messages",
            )
        dropped = len(messages) - len(result.kept)
        return self._fitted(
            [result.ids], before, ask, dropped, result.steps, result.messages, truncated=result
        )

    async def fit_prompts(
        self,
        prompts: list[list[int]],
        *,
        max_tokens: int | None,
        min_tokens: int = 0,
        truncation: Truncation | None = None,
        keep_prefix: int = 0,
    ) -> FittedPrompts:
        """Text-completion prompts, each cut to its end if too long and allowed (its first
        `keep_prefix` ids, the tokenizer's own special tokens, are kept), and the max_tokens."""
        ask = _Ask(max_tokens, min_tokens, "prompt")
        limit = self._prompt_limit(ask)
        before = sum(len(p) for p in prompts)
        if (truncation or self._policy.completion_truncation) == "disabled" or limit <= keep_prefix:
            self._check_fits(max(len(p) for p in prompts), limit, ask.param)
            return self._fitted(prompts, before, ask)
        tail = limit - keep_prefix
        fitted = [p if len(p) <= limit else p[:keep_prefix] + p[len(p) - tail :] for p in prompts]
        steps = ("cut_prompt",) if fitted != prompts else ()
        return self._fitted(fitted, before, ask, steps=steps)

    def fits_whole(self, text: str) -> bool:
        """Whether a text prompt is short enough in characters to be tokenized as it is."""
        return len(text) <= MAX_TOKEN_CHARS * self._max_model_len

    def bound_text(self, text: str, truncation: Truncation | None = None) -> str:
        """A text prompt longer in characters than any prompt that fits could be (see
        `MAX_TOKEN_CHARS`): refused at once, or with truncation on, cut to the end that could
        fit, before it is tokenized. Tokenizing megabytes only to cut them costs seconds."""
        if self.fits_whole(text):
            return text
        longest = MAX_TOKEN_CHARS * self._max_model_len
        if (truncation or self._policy.completion_truncation) == "disabled":
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self._max_model_len} tokens. "
                f"However, your prompt has {len(text)} characters, more than that many tokens "
                "can hold. Please reduce the length of the prompt.",
                param="prompt",
            )
        return text[-longest:]

    def _refuse_images(self, prompt: int, limit: int, image_tokens: int | None) -> NoReturn:
        room = self._max_model_len - limit
        images = "" if image_tokens is None else f", {image_tokens} of them for their images"
        raise ContextLengthExceededError(
            f"This model's maximum context length is {self._max_model_len} tokens. However, "
            f"you requested {prompt + room} tokens ({prompt} in the messages{images}, {room} "
            "in the completion). A conversation with images is not truncated: please send "
            "fewer or smaller images, or shorter messages.",
            param="messages",
        )

    def _prompt_limit(self, ask: _Ask) -> int:
        """The most prompt tokens that leave the completion its minimum room."""
        return self._max_model_len - ask.room(self._policy)

    def _check_fits(self, prompt: int, limit: int, param: str) -> None:
        if prompt > limit:
            room = self._max_model_len - limit
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self._max_model_len} tokens. "
                f"However, you requested {prompt + room} tokens ({prompt} in the {param}, "
                f"{room} in the completion). Please reduce the length of the {param} or "
                "completion.",
                param=param,
            )

    def _fitted(
        self,
        prompts: list[list[int]],
        before: int,
        ask: _Ask,
        dropped: int = 0,
        steps: tuple[str, ...] = (),
        messages: ChatMessages | None = None,
        truncated: TruncatedChat | None = None,
        extra: int = 0,
    ) -> FittedPrompts:
        """`extra`: the prompt's tokens beyond its ids (its images')."""
        max_tokens, source = self._max_tokens(max(len(p) for p in prompts) + extra, ask)
        after = sum(len(p) for p in prompts) + extra
        report = BudgetReport(before, after, max_tokens, source, dropped, steps, truncated)
        if report.trimmed:
            BUDGET_TRIMMED_REQUESTS.inc()
            BUDGET_DROPPED_TOKENS.inc(before - after)
        if source == "clamped":
            BUDGET_CLAMPED_MAX_TOKENS.inc()
        return FittedPrompts(prompts, max_tokens, report, messages)

    def _max_tokens(self, prompt: int, ask: _Ask) -> tuple[int, MaxTokensSource]:
        """What the completion gets after a (longest) prompt that leaves it its room."""
        policy = self._policy
        budget = self._max_model_len - prompt
        if ask.max_tokens is None:
            share = int(budget * (1 - policy.reserve_ratio))
            least = min(policy.min_completion_tokens, policy.default_max_tokens)
            return max(min(share, policy.default_max_tokens), least, ask.min_tokens), "default"
        if ask.max_tokens <= budget:
            return ask.max_tokens, "client"
        # With overflow "error", the prompt limit already made room for all of max_tokens.
        return budget, "clamped"


@dataclass(frozen=True, slots=True)
class _Ask:
    """What the request asks of the completion."""

    max_tokens: int | None
    min_tokens: int
    param: str
    """The request field holding the prompt, named in errors."""

    def insists(self, policy: BudgetPolicy) -> bool:
        """Whether the client's max_tokens must fit whole (overflow "error") rather than
        being clamped to what the prompt leaves."""
        return self.max_tokens is not None and policy.overflow == "error"

    def room(self, policy: BudgetPolicy) -> int:
        """Completion tokens the prompt must leave: the client's max_tokens when it must fit
        whole, else the minimum completion size or the client's smaller max_tokens; never
        less than its min_tokens. Truncation makes this room."""
        room = policy.min_completion_tokens
        if self.max_tokens is not None:
            room = self.max_tokens if self.insists(policy) else min(room, self.max_tokens)
        return max(room, self.min_tokens)
