"""One request as the traffic capture (`observability.capture`) sees it, filled in while it is
served: its arrival (`TelemetryMiddleware`), its shape once prepared (`TrafficEntry.shape`,
from the route's `Exchange`), whether it runs on the engine (`runs`, after the cache lookup),
and each sequence's output as the engine gives it (`add`, from `GenerationTelemetry`).

It holds references, not copies: the prompt's ids stay the run's own list until the capture's
writer thread has hashed them into block digests (`PrefixBlocks`), then they are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class CapturedPrompt(Protocol):
    """What the capture reads of a prompt (`engine.protocol.Prompt`)."""

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def length(self) -> int: ...

    @property
    def images(self) -> Sequence[object]: ...


class CapturedOptions(Protocol):
    @property
    def max_tokens(self) -> int: ...

    @property
    def n(self) -> int: ...


class CapturedRun(Protocol):
    """What the capture reads of a run (`inference.run.Run`), before its admission."""

    @property
    def prompts(self) -> Sequence[CapturedPrompt]: ...

    @property
    def options(self) -> CapturedOptions: ...

    @property
    def priority(self) -> int: ...

    @property
    def counted(self) -> Mapping[int, int]: ...


@dataclass(slots=True, eq=False)
class TrafficEntry:
    api: str
    """`chat`, `completions`, `messages` or `responses`: the path it came by."""
    started: float
    """`RequestRecord.started`: its arrival."""
    sampled: bool
    """The sample took it (`TRAFFIC_CAPTURE_SAMPLE`)."""
    kept: bool = False
    """The writer took its arrival: its place in the arrival order is held."""
    prompts: tuple[Sequence[int], ...] = field(default=(), repr=False)
    """Each prompt's token ids after the template and the budget; empty when not counted
    here, and for a prompt with images (its ids hold placeholders for them): no blocks."""
    lengths: tuple[int, ...] = ()
    counted: Mapping[int, int] | None = None
    """The engine's own count of the prompts no tokenizer here counted (`Run.counted`)."""
    n: int = 1
    max_tokens: int = 1
    priority: int = 0
    """The rank the client asked for, before admission makes it the engine's."""
    stream: bool = False
    cache: str | None = None
    """`MISS` or `BYPASS` once it runs on the engine; None: it does not (a cache hit, a
    follower of an identical request in flight) or not yet."""
    tokens: list[int] = field(default_factory=list)
    """Each sequence's output tokens (prompt by prompt, each prompt's n choices)."""
    reasons: list[str | None] = field(default_factory=list)
    ended: bool = False
    """Its response has ended: what comes after (a shared run going on) is not its own."""
    # The writer thread's own, once `ended`:
    digests: list[list[bytes]] | None = None
    given_up: bool = False

    def shape(self, run: CapturedRun, stream: bool) -> None:
        """The request prepared on a model (again, on each model of a fallback chain)."""
        prompts = run.prompts
        self.prompts = tuple(() if p.images else p.ids for p in prompts)
        self.lengths = tuple(p.length for p in prompts)
        self.counted = run.counted
        self.n = max(1, run.options.n)
        self.max_tokens = run.options.max_tokens
        self.priority = run.priority
        self.stream = stream
        self.cache = None
        sequences = len(prompts) * self.n
        self.tokens = [0] * sequences
        self.reasons = [None] * sequences

    def runs(self, cache: str) -> None:
        """It goes to the engine, after the cache said `cache` (MISS or BYPASS)."""
        self.cache = cache

    def add(self, prompt_index: int, choice: int, tokens: int, reason: str | None) -> None:
        """One engine delta of a sequence."""
        at = prompt_index * self.n + choice
        if self.ended or not 0 <= at < len(self.tokens):
            return
        self.tokens[at] += tokens
        if reason is not None:
            self.reasons[at] = reason

    @property
    def sequences(self) -> int:
        """The lines it makes: one per engine sequence."""
        return len(self.tokens)

    def input_tokens(self, prompt_index: int) -> int:
        """The prompt's tokens as the engine took them: its own count where it gave one."""
        counted = None if self.counted is None else self.counted.get(prompt_index)
        return self.lengths[prompt_index] if counted is None else counted
