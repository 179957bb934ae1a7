"""The small surface the gateway needs from an inference engine.

Two engines implement it: the in-process vLLM adapter (`engine.vllm_engine`), and remote
OpenAI-compatible servers (`engine.upstream`); unit tests use a fake. Nothing here imports
vLLM, so gateway logic can be typed and tested without it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "abort"]
MAX_TOKEN_CHARS = 128
"""No token is longer than this many characters (vocabularies stay far below): a text of
more characters than this many times N tokens cannot fit in N."""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on what the engine may generate (vLLM's `StructuredOutputsParams`).

    Exactly one of `json` (a JSON schema, as canonical JSON text), `json_object`, `regex`,
    `choice` and `grammar` (EBNF or Lark) is set."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    compact_whitespace: bool = True
    """No free whitespace between JSON tokens, so JSON modes end instead of rambling."""


@dataclass(frozen=True, slots=True)
class ReasoningOptions:
    """How a reasoning model thinks for one chat-shaped request (chat's reasoning fields, the
    Messages API's `thinking`)."""

    include: bool = True
    """`include_reasoning`: false drops the thoughts from the answer (they still count)."""
    effort: str | None = None
    """`reasoning_effort` (vLLM's values: none, minimal, low, medium, high, xhigh, max)."""
    template_kwargs: str | None = None
    """The request's `chat_template_kwargs` as it sent them, as canonical JSON (sorted keys),
    so the options stay hashable and key the cache; None: none."""
    budget: int | None = None
    """`thinking_token_budget`: the most tokens the model may think for."""

    def sent_kwargs(self) -> dict[str, Any] | None:
        """The request's own `chat_template_kwargs` (a new mapping each call), or None."""
        return None if self.template_kwargs is None else dict(json.loads(self.template_kwargs))

    def kwargs(self) -> dict[str, Any]:
        """What the chat template gets: the request's kwargs with the effort's own, merged as
        vLLM's server merges them (`reasoning_effort`, and `enable_thinking` false for effort
        "none", true otherwise, unless the request set it)."""
        kwargs = self.sent_kwargs() or {}
        if self.effort is not None:
            kwargs["reasoning_effort"] = self.effort
            kwargs.setdefault("enable_thinking", self.effort != "none")
        return kwargs


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling parameters with every default filled in (OpenAI's where it has one)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    """None: no logprobs. k >= 0: the sampled token's logprob plus the top k alternatives."""
    ignore_eos: bool = False
    min_tokens: int = 0
    structured: StructuredOutput | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias in [-100, 100]) pairs, added to the logits before sampling."""
    prompt_logprobs: int | None = None
    """None: none. k >= 0: each prompt token's logprob plus the top k (completions `echo`)."""
    max_tokens_given: bool = True
    """False: `max_tokens` only bounds what the gateway reserves, and the engine decides the
    length (an upstream whose tokens no budget could count, and no `max_tokens` asked)."""
    reasoning: ReasoningOptions | None = None
    """A chat-shaped request's reasoning fields; None for a completion, or a chat that set
    none (the model's defaults)."""
    pass_through: bool = False
    """The run is a plain stream (`Run.plain_stream`) that nothing collects: an engine whose
    output is already the client's wire (an upstream's chunks) may hand its events on as they
    came (`ChoiceDelta.raw`) instead of text to render. Engines that cannot ignore it."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float | None
    """None only for a prompt's first token, which nothing predicts (completions `echo`)."""
    top: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice produced since the previous step."""

    index: int
    text: str
    num_tokens: int
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_sequence: str | None = None
    """With finish reason `stop`: the stop string that ended the choice, where the engine
    says (vLLM does); None when it ended otherwise, or the engine does not say."""
    raw: str | None = None
    """With `SamplingOptions.pass_through`: the events this delta came from, framed as they
    go to the client (`data: {...}` lines, each ended by a blank line), in the upstream's
    envelope (its id, creation time and model name: `wire.passthrough` puts the run's in).
    They stand for the delta's text, which is then not rendered."""
    reasoning: str = ""
    """The part of the output the model thought in, split from `text` (the answer) by a
    reasoning parser: the engine's own or the gateway's (`ReasoningParser`)."""
    reasoning_tokens: int = 0
    """Tokens of this choice's output counted as reasoning, added to those of its earlier
    deltas (engines count them at the end: the finishing delta carries them all)."""
    token_ids: Sequence[int] | None = None
    """The ids of the tokens this delta's text came from, where the engine has them (the
    in-process engine): what the gateway's reasoning parser reads. Live runs only; nothing
    stores them."""


@dataclass(frozen=True, slots=True)
class EngineTimes:
    """When the engine took a request, first scheduled it, and produced its first token, by
    the engine's own clock read as `time.perf_counter()`."""

    queued: float
    scheduled: float
    first_token: float


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's scheduler after its latest step (vLLM's `SchedulerStats`)."""

    waiting: int
    """Requests in the engine's waiting queue (not yet scheduled, or preempted)."""
    running: int
    """Requests in the running batch."""
    kv_cache_usage: float
    """Share of the KV cache's blocks in use, 0 to 1."""
    step_seconds: float = 0.0
    """How long one engine step has lately taken while the engine had work (0: not known
    yet); a request handed to a busy engine waits for the step it is in."""


@dataclass(slots=True)
class EngineStep:
    """One engine output for a request: the deltas of the choices that moved."""

    choices: list[ChoiceDelta] = field(default_factory=list)
    prompt_tokens: int = 0
    finished: bool = False
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """With `SamplingOptions.prompt_logprobs`, in the first step: one entry per prompt token
    (None for the first, which nothing predicts)."""
    times: EngineTimes | None = None
    """In the first step with a token, from an engine that reports them (vLLM's)."""
    retried: bool = False
    """Set on every step of a run whose first step came after a failed try (an upstream
    retried it): its first token is late for a reason no queue forecast models."""


@dataclass(frozen=True, slots=True)
class ChatEncoding:
    """A chat prompt's token ids, and which of them each message accounts for.

    `message_tokens[i]` counts the ids message i adds: its content and the template's framing
    before it (role header, the previous message's end marker). `content_tokens[i]` is the
    content's share. Ids after the last content (closing markers, the generation prompt) are
    in neither. For templates that do not copy contents verbatim the split is an estimate;
    `ids` are always exact.
    """

    ids: list[int]
    message_tokens: tuple[int, ...]
    content_tokens: tuple[int, ...]
    length: int = -1
    """How many ids the prompt has. `ids` is left empty when there are more than the caller
    said it could use (`encode_chat_counted`'s `ids_up_to`): for megabytes of text, building
    the list alone holds the GIL for tens of milliseconds."""
    tokens_per_char: float | None = None
    """Set when the tokenizer counts whole prompts only, one costly call each (an upstream's
    `/tokenize`, one HTTP request per text): the split is then estimated from characters at
    this density, and the parts of the prompt are estimated the same way, never counted."""

    def __post_init__(self) -> None:
        if self.length < 0:
            object.__setattr__(self, "length", len(self.ids))


@dataclass(frozen=True, slots=True)
class Tokenized:
    ids: list[int]
    strings: list[str] | None = None


ChatMessages = Sequence[Mapping[str, Any]]
"""Messages as chat templates take them: `role` and `content` (text), and where the message
has them `name`, `tool_calls` (arguments parsed to JSON values) and `tool_call_id`. A user
message with images also has `parts`: its text and images in order (`{"type": "text",
"text": ...}`, `{"type": "image"}`), its images those of `Prompt.images` in the order of the
conversation; `content` is then its text alone."""
Tools = Sequence[Mapping[str, Any]]
"""Tools as chat templates take them (OpenAI's `{"type": "function", "function": {...}}`)."""
TemplateKwargs = Mapping[str, Any]
"""Keyword arguments of a chat template (`chat_template_kwargs`: `enable_thinking`,
`reasoning_effort`, ...)."""


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A chat prompt before any template: for engines that render chats themselves."""

    messages: ChatMessages
    """As fitted by the token budget (older turns may be gone)."""
    tools: Tools | None = None
    tool_choice: object = None
    """OpenAI's `tool_choice` as JSON data; None: not sent."""
    parallel_tool_calls: bool = True


@dataclass(frozen=True, slots=True)
class PromptImage:
    """An image of a prompt, read by the gateway (`media`): the engine never fetches."""

    digest: str
    """SHA-256 of its bytes, hex: what the cache key and vLLM's multimodal ids hold."""
    media_type: str
    data: bytes = field(repr=False)
    pixels: Any = field(repr=False, compare=False)
    """Its pixels (a PIL image, RGB), for an engine in this process."""
    detail: str | None = None
    url: str | None = field(default=None, repr=False)
    """The http(s) URL it was fetched from (the same URL may give other bytes later; never in
    a repr: it may carry a signed token); None: it came inline."""

    def data_uri(self) -> str:
        """The image inline, as upstreams get it."""
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as the engine receives it."""

    ids: list[int]
    """Token ids, as the budget fitted them; empty when nothing could count them (an
    upstream with no tokenizer: `EngineClient.tokenizer` is None)."""
    chat: ChatPrompt | None = None
    """The chat, for an engine that renders it itself (`EngineClient.renders_chat`)."""
    text: str | None = None
    """A completion prompt's text when it was sent as text and kept whole."""
    images: tuple[PromptImage, ...] = ()
    """A chat's images, in the order of its messages' `parts`; `ids` hold one placeholder
    per image (the template's), which the engine expands."""
    image_tokens: int = 0
    """The tokens the images add beyond their placeholders (`EngineClient.image_tokens`)."""
    images_estimated: bool = False
    """`image_tokens` is an estimate (an upstream's): the engine's own count of the prompt,
    when it gives one, is the prompt's."""

    @property
    def length(self) -> int:
        return len(self.ids) + self.image_tokens


class PromptTokenizer(Protocol):
    """Turns requests into the token ids the engine receives."""

    @property
    def vocab_size(self) -> int: ...

    async def encode_chat(
        self,
        messages: ChatMessages,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> list[int]:
        """Apply the model's chat template with a generation prompt, then tokenize. `tools`
        are rendered by the template (into the first system turn, for the shipped one);
        `template_kwargs` are the template's own arguments (`chat_template_kwargs`: those the
        template does not use are left out)."""
        ...

    async def encode_chat_counted(
        self,
        messages: ChatMessages,
        ids_up_to: int | None = None,
        tools: Tools | None = None,
        template_kwargs: TemplateKwargs | None = None,
    ) -> ChatEncoding:
        """`encode_chat`, with the ids attributed to the messages (for the token budget).
        With more than `ids_up_to` ids, only their number is returned (`ChatEncoding.length`)."""
        ...

    async def count(self, texts: Sequence[str]) -> list[int]:
        """Token counts of texts as parts of a prompt (no special tokens added)."""
        ...

    async def encode(self, text: str) -> list[int]:
        """Tokenize plain text, the way the engine would for a completion prompt."""
        ...

    async def tokenize(
        self, text: str, add_special_tokens: bool = True, with_strings: bool = False
    ) -> Tokenized:
        """Tokenize text (`/tokenize`): its ids, and with `with_strings` each id's token
        string as the vocabulary spells it."""
        ...

    async def render_chat(
        self,
        messages: ChatMessages,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: TemplateKwargs | None = None,
    ) -> str:
        """The chat template applied to the messages, as text."""
        ...

    async def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (special tokens kept), as vLLM's server detokenizes."""
        ...


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    name: str
    arguments: str
    """JSON text."""


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    """A whole completion's text split by a tool parser: the calls, and the text left."""

    content: str | None
    calls: tuple[ParsedToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallFragment:
    """A piece of the `index`th call: its name when it first appears, then argument text."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ParsedDelta:
    content: str | None = None
    calls: tuple[ToolCallFragment, ...] = ()


class ToolCallStream(Protocol):
    """One streamed choice's tool parser: holds what it has seen."""

    def feed(self, text: str) -> ParsedDelta:
        """The content and call fragments `text` (the next piece of output) completes."""
        ...


class ToolCallParser(Protocol):
    """Finds tool calls in a model's text in the model's own format (`tool_call_parser`)."""

    name: str
    reads_forced: bool
    """Whether it also reads the calls of `required` and named `tool_choice` (an engine that
    enforces `tool_choice` itself); otherwise the gateway constrains and reads those."""

    def extract(self, text: str, tools: Tools) -> ParsedToolCalls: ...

    def stream(self, tools: Tools) -> ToolCallStream: ...


class ReasoningStream(Protocol):
    """One choice's reasoning parser: splits its output, piece by piece, into thoughts and
    answer. Holds what it has seen."""

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str, str]:
        """The reasoning and the content `text` (the next piece of output, made of the tokens
        `token_ids`) completes; `finished` on the choice's last piece, so nothing is held."""
        ...

    def count(self) -> int:
        """How many of the tokens fed so far the parser counts as reasoning."""
        ...


class ReasoningParser(Protocol):
    """Splits a reasoning model's output into thoughts and answer, in the model's own format
    (`reasoning_parser`: one of vLLM's parsers)."""

    name: str

    def stream(
        self, prompt_ids: Sequence[int], template_kwargs: Mapping[str, Any]
    ) -> ReasoningStream:
        """A parser for one choice of a prompt (a prompt that already ends the thoughts, as a
        template turning thinking off writes, makes the whole output content)."""
        ...


class EngineClient(Protocol):
    @property
    def tokenizer(self) -> PromptTokenizer | None:
        """The model's tokenizer; None when none is known (an upstream without one): the
        token budget is then off and token counts come from the engine's usage."""
        ...

    @property
    def renders_chat(self) -> bool:
        """Whether the engine takes chats as messages (`Prompt.chat`) and applies its own
        template, tool parser and structured outputs, rather than taking token ids."""
        ...

    @property
    def tool_parser(self) -> ToolCallParser | None:
        """The parser for `tool_choice` "auto", if one is configured."""
        ...

    @property
    def reasoning_parser(self) -> ReasoningParser | None:
        """The parser the gateway splits the output's reasoning with, if one is configured
        and the engine does not split it itself (an upstream reports it split)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def takes_images(self) -> bool:
        """Whether the model reads images (`Prompt.images`); a request with one is refused
        before anything is fetched when it does not."""
        ...

    async def image_tokens(self, images: Sequence[PromptImage]) -> tuple[list[int], bool]:
        """The tokens each image adds to a prompt beyond its placeholder, and whether they are
        exact: in process they are (vLLM's processor), upstream an estimate
        (`media_upstream_image_tokens`)."""
        ...

    def generate(
        self,
        request_id: str,
        prompt: Prompt,
        options: SamplingOptions,
        *,
        arrival_time: float,
        priority: int = 0,
        adapter: str | None = None,
    ) -> AsyncGenerator[EngineStep, None]:
        """Stream the request's outputs. Closing the iterator early aborts the request.

        `arrival_time` (wall clock, `time.time()`) is when the gateway began preparing the
        request: the engine's own latency metrics count from it, as behind vLLM's server.
        `priority` orders the engine's queue under priority scheduling (lower runs first).
        `adapter` names a LoRA adapter of the engine's base model to run with (an upstream
        gets it as the model it asks for). The last step carries `prompt_tokens` as the
        engine counted them.

        Raises `errors.EngineUnavailableError` when the engine cannot serve, and
        `errors.InvalidRequestError` when it refuses the input.
        """
        ...

    async def check_structured(self, structured: StructuredOutput) -> None:
        """Raise `errors.InvalidRequestError` (its message only) if the engine would refuse
        the constraint. May take milliseconds: the caller runs it once per new constraint."""
        ...

    def load(self) -> EngineLoad | None:
        """The engine's scheduler state now, or None where it is not known (an upstream).
        An engine with no request in flight reports nothing waiting or running."""
        ...

    async def check_health(self) -> None:
        """Raise `errors.EngineUnavailableError` unless the engine can take requests."""
        ...

    async def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Embedding:
    """One input's vector, and the tokens the engine counted for it."""

    vector: list[float]
    prompt_tokens: int


class EmbeddingEngine(Protocol):
    """An engine that embeds (vLLM's pooling runner, or upstreams' `/v1/embeddings`)."""

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        """The model's tokenizer; None when none is known (an upstream without one)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    async def embed(
        self, request_id: str, prompts: Sequence[Prompt], dimensions: int | None
    ) -> list[Embedding]:
        """One embedding per prompt, in order, computed together. Raises
        `errors.EngineUnavailableError` when the engine cannot serve, and
        `errors.InvalidRequestError` when it refuses the input (`dimensions` it does not
        support)."""
        ...

    async def check_dimensions(self, dimensions: int) -> None:
        """Raise `errors.InvalidRequestError` (param `dimensions`) unless the model gives
        vectors of that size."""
        ...

    def load(self) -> EngineLoad | None: ...

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...
