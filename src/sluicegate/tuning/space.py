"""What `sluicegate tune` searches, for this profile on this host.

Two kinds of knob. The gateway's admission bounds (`ttft_objective`, `max_engine_running`)
change on a running gateway (`PUT /admin/admission`): trying one costs only its window. The
engine's (`max_num_seqs`, `max_num_batched_tokens`, `long_prefill_token_threshold`, prefix
caching, the scheduling policy; on GPU hosts the memory share and tensor parallelism) need a
new engine: a start each.

The grid is coarse and one knob at a time from today's settings (each value a step the
operator would try by hand; one step of every knob before a second of any), then each engine
step with the admission bounds that did best in the first stage, against those bounds alone:
the search's halving does the rest. When today's misses were mostly streams too slow rather
than first tokens too late, the steps that bound a step's work go first (`SMOOTHING`). A bound
on one prompt's tokens a step is searched only below the traffic's longest prompt (above it,
it bounds nothing), prefix caching only when the traffic shares prefixes, the scheduling
policy only when it carries priorities (it would change nothing otherwise), the GPU knobs
only where there are GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluicegate.tuning.profile import Profile
from sluicegate.tuning.search import Config

ADMISSION_KNOBS = (
    "ttft_objective",
    "max_engine_running",
    "max_engine_waiting",
    "max_kv_cache_usage",
)
"""Bounds a running gateway takes at `PUT /admin/admission`: no restart."""
ENGINE_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "scheduling_policy",
    "gpu_memory_utilization",
    "tensor_parallel_size",
)
"""Settings the engine reads at its start: a restart each."""

SEQS = (8, 16, 32, 64)
BATCHED_TOKENS = (1024, 2048, 4096, 8192)
LONG_PREFILL = (128, 256, 512)
"""`long_prefill_token_threshold`: a long prompt prefilled this many tokens a step, so that
the streams already decoding are not held up by it for a whole prefill."""
RUNNING = (16, 32)
OBJECTIVE_SHARES = (0.5, 0.75, 1.0)
"""The gateway's TTFT objective as a share of the tune's TTFT target."""
GPU_MEMORY = (0.85, 0.9, 0.95)


def engine_part(config: Config) -> Config:
    return Config(tuple((k, v) for k, v in config.knobs if k in ENGINE_KNOBS))


def admission_part(config: Config) -> Config:
    return Config(tuple((k, v) for k, v in config.knobs if k in ADMISSION_KNOBS))


def needs_restart(config: Config) -> bool:
    return bool(engine_part(config).knobs)


SMOOTHING = ("long_prefill_token_threshold", "max_num_batched_tokens", "max_num_seqs")
"""The engine knobs that bound a step's work, so that no stream waits long for its next
token, in the order of what they cost the others' first tokens: a prefill bound delays only
long prompts, a token bound every prefill, a sequence bound every request."""


@dataclass(frozen=True, slots=True)
class SearchSpace:
    admission: tuple[Config, ...]
    """Today's settings first, then one admission bound changed each."""
    engine: tuple[Config, ...]
    """One engine setting changed each, one step of every knob before a second of any."""
    smoothing_first: tuple[Config, ...] = ()
    """The same steps, those that make a step's work smaller than today's first
    (`SMOOTHING`, in its order): for traffic whose misses are streams too slow."""

    @classmethod
    def for_host(
        cls, profile: Profile, today: Mapping[str, object], ttft_target: float, gpus: int = 0
    ) -> SearchSpace:
        """The grid around `today` (today's values by setting name) for `profile` on a host
        with `gpus` GPUs (0: vLLM's CPU build)."""
        admission: list[dict[str, object]] = [{}]
        for share in OBJECTIVE_SHARES:
            admission.append({"ttft_objective": round(share * ttft_target, 3)})
        for running in RUNNING:
            admission.append({"max_engine_running": running})
        longest = max((r.input_tokens for r in profile.requests), default=0)
        knobs: list[list[dict[str, object]]] = [
            [{"max_num_seqs": n} for n in SEQS],
            [{"max_num_batched_tokens": n} for n in BATCHED_TOKENS],
            [{"long_prefill_token_threshold": n} for n in LONG_PREFILL if n < longest],
        ]
        if profile.shares_prefixes():
            knobs.append([{"enable_prefix_caching": not today.get("enable_prefix_caching", True)}])
        if profile.has_priorities():
            policy = today.get("scheduling_policy", "fcfs")
            knobs.append([{"scheduling_policy": "fcfs" if policy == "priority" else "priority"}])
        if gpus:
            knobs.append([{"gpu_memory_utilization": share} for share in GPU_MEMORY])
            knobs.append([{"tensor_parallel_size": n} for n in range(2, gpus + 1) if gpus % n == 0])
        steps = [[c for c in _changed(values, today) if c.knobs] for values in knobs]
        engine = _interleaved(steps)
        smaller = [[c for c in engine if _smaller(c, name, today)] for name in SMOOTHING]
        first = _interleaved(smaller)
        smoothing_first = first + tuple(c for c in engine if c not in first)
        return cls(_changed(admission, today), engine, smoothing_first)

    def engine_with(self, bounds: Config, slow_streams: bool = False) -> list[Config]:
        """The second stage: `bounds` (the first stage's best admission bounds, or today's
        settings) as they are, then every engine step with them; with `slow_streams` (today's
        misses were mostly streams too slow, not first tokens too late), the steps that bound
        a step's work first."""
        extra = dict(bounds.knobs)
        steps = self.smoothing_first if slow_streams else self.engine
        return list(
            dict.fromkeys([bounds, *(Config.of({**dict(c.knobs), **extra}) for c in steps)])
        )


def _interleaved(families: list[list[Config]]) -> tuple[Config, ...]:
    """One step of each knob before a second of any: a budget that runs out within the first
    window has tried every knob once, not one knob's every value."""
    longest = max(map(len, families), default=0)
    return tuple(f[i] for i in range(longest) for f in families if i < len(f))


def _smaller(config: Config, name: str, today: Mapping[str, object]) -> bool:
    """Whether `config` sets `name` below today's value (a prefill bound where today has
    none counts)."""
    value, now = config.get(name), today.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    if name == "long_prefill_token_threshold" and not now:
        return True
    return isinstance(now, int) and value < now


def _changed(
    candidates: Iterable[Mapping[str, object]], today: Mapping[str, object]
) -> tuple[Config, ...]:
    """The candidates less the knobs at today's value (a step to where one already is is no
    step), each once; an emptied one is today's settings."""
    kept: list[Config] = []
    for candidate in candidates:
        knobs = {k: v for k, v in candidate.items() if today.get(k) != v}
        if knobs or not candidate:
            kept.append(Config.of(knobs))
    return tuple(dict.fromkeys(kept))
