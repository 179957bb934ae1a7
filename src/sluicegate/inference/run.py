"""A request ready for the engine (`Run`), and the bounds on what one request may ask."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import orjson

from sluicegate.engine.protocol import Prompt, SamplingOptions
from sluicegate.errors import InvalidRequestError
from sluicegate.inference.budget import BudgetReport
from sluicegate.keys import ANONYMOUS
from sluicegate.wire.formats import ChatFormat, ResponseFormat
from sluicegate.wire.passthrough import passes_through
from sluicegate.wire.tools import ToolLimits


@dataclass(frozen=True, slots=True)
class Echo:
    """Completions `echo`: each choice's text starts with its prompt's."""

    texts: tuple[str, ...]
    """Each prompt's text: as sent, or its ids detokenized (token prompts, cut prompts)."""
    first_tokens: tuple[str, ...]
    """Each prompt's first token as text (the one prompt token without a logprob)."""
    scores_only: bool = False
    """`max_tokens` 0: the prompt is the whole answer; the one token the engine has to
    generate is dropped (and not counted), as vLLM's server does."""

    def key(self) -> list[object]:
        """What the echo adds to a response, for the cache key."""
        return [list(self.texts), self.scores_only]


@dataclass(frozen=True, slots=True)
class Run:
    """A request ready for the engine: its prompts plus filled-in sampling options."""

    id: str
    prompts: list[Prompt]
    options: SamplingOptions
    format: ResponseFormat
    arrival_time: float
    """Wall-clock time (`time.time()`) at which preparing the request began."""
    include_usage: bool = False
    budget: BudgetReport | None = None
    priority: int = 0
    """The priority the request asked for until admission (`quota.share`) makes it the
    engine's (vLLM runs lower values first)."""
    key_id: str = ANONYMOUS
    """The API key's public id, set at admission: whose backlog the run is."""
    echo: Echo | None = None
    model: str = ""
    """The served model's name, which the response carries (an alias resolved)."""
    identity: str = ""
    """What the answer depends on besides the request: the weights (and adapter) behind
    `model`, for the cache key."""
    counted: dict[int, int] = field(default_factory=dict)
    """Prompt tokens the engine counted, by prompt, for prompts whose ids the gateway does
    not know (an upstream without a tokenizer), or whose images it estimated
    (`Prompt.images_estimated`); filled in as the run goes."""
    began: set[int] = field(default_factory=set)
    """The prompts the engine took up (a step of theirs came); filled in as the run goes."""

    def engine_request_id(self, prompt_index: int) -> str:
        return self.id if len(self.prompts) == 1 else f"{self.id}-{prompt_index}"

    def choice_index(self, prompt_index: int, index: int) -> int:
        return prompt_index * self.options.n + index

    @property
    def prompt_tokens(self) -> int:
        """Its prompts' tokens: as tokenized here, or as the engine counted them (for those
        no tokenizer here counts, known once their first step came)."""
        return sum(p.length for i, p in enumerate(self.prompts) if i not in self.counted) + sum(
            self.counted.values()
        )

    def uncounted_prompt_bound(self) -> int:
        """At most how many tokens the prompts no tokenizer here counted may take, to be
        reserved before the run: one per byte of their text (a token is at least a byte), a
        chat's in its JSON (whose syntax stands for its template's tokens), and
        `TEMPLATE_TOKENS` more for each."""
        total = 0
        for prompt in self.prompts:
            if prompt.ids:
                continue
            if prompt.text is not None:
                total += len(prompt.text.encode("utf-8", "surrogatepass")) + TEMPLATE_TOKENS
            elif (chat := prompt.chat) is not None:
                text = orjson.dumps([chat.messages, chat.tools], default=str)
                total += len(text) + TEMPLATE_TOKENS
        return total

    def used_prompt_tokens(self, answered: bool) -> int:
        """The prompt tokens the run used: those of the prompts the engine took up. For a
        run whose output came from another's (an identical request's), all of them once
        some came (`answered`)."""
        if not self.began:
            return self.prompt_tokens if answered else 0
        return sum(self.counted.get(index, self.prompts[index].length) for index in self.began)

    def plain_stream(self) -> bool:
        """Whether the run, streamed, could be its engine's own events (`wire.passthrough`):
        one prompt, one choice, no logprobs, no echo, in a format with no events of its
        own (a chat without tools, a text completion), whose thoughts the gateway neither
        splits (its engine has a reasoning parser) nor drops (`include_reasoning` false: an
        upstream may not know the field, so the rendered path leaves them out itself)."""
        options = self.options
        return (
            len(self.prompts) == 1
            and options.n == 1
            and options.logprobs is None
            and options.prompt_logprobs is None
            and self.echo is None
            and passes_through(self.format)
            and not _reworks_reasoning(self.format)
        )

    def passing_through(self) -> Run:
        """The run asking its engine for its own events (`SamplingOptions.pass_through`)."""
        return replace(self, options=replace(self.options, pass_through=True))

    @property
    def expected_choices(self) -> int:
        """The sequences the run starts in the engine: prompts × n."""
        return len(self.prompts) * self.options.n

    @property
    def sequences_param(self) -> str:
        """The parameter to name when the run starts too many sequences."""
        return sequences_param(len(self.prompts), self.options.n)


def _reworks_reasoning(fmt: ResponseFormat) -> bool:
    """Whether a chat's thoughts are the gateway's to split (`ChatFormat.reasons`: its
    engine's output is split by the gateway's parser) or to drop."""
    return isinstance(fmt, ChatFormat) and (fmt.reasons or not fmt.include_reasoning)


TEMPLATE_TOKENS = 256
"""Tokens a prompt no tokenizer here counts may take beyond its text: special tokens, a chat
template's headers and the default system prompt some templates add."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what one request may ask for; each breach is a 400 naming the parameter."""

    max_messages: int = 2048
    max_prompts: int = 64
    max_n: int = 16
    max_tokens: int | None = None
    # vLLM checks every stop string against each new token's text on the event loop, so their
    # number and length bound the work one request puts on every other.
    max_stop_sequences: int = 64
    max_stop_length: int = 1024
    max_sequences: int = 64
    """Sequences (prompts × n) one request may start."""
    tools: ToolLimits = field(default_factory=ToolLimits)

    def check_sequences(self, prompts: int, n: int) -> None:
        if prompts * n > self.max_sequences:
            raise InvalidRequestError(
                f"This request would start {prompts * n} sequences ({prompts} prompts × n={n}); "
                f"at most {self.max_sequences} are accepted per request.",
                param=sequences_param(prompts, n),
            )


def sequences_param(prompts: int, n: int) -> str:
    return "n" if n > 1 or prompts == 1 else "prompt"
