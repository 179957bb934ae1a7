"""The response cache's pure parts: keys, the TTL policy, the stored form, the memory store."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sluicegate.cache.entry import CorruptEntryError, decode_entry, encode_entry
from sluicegate.cache.key import cache_key, is_cacheable
from sluicegate.cache.store import MemoryStore
from sluicegate.cache.ttl import TtlPolicy, TtlRule
from sluicegate.engine.protocol import (
    ChoiceDelta,
    Prompt,
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
)
from sluicegate.wire.completion import ChoiceState, Completion

PROMPT = [[1, 2, 3, 400]]
GREEDY = SamplingOptions(max_tokens=16, temperature=0.0)


def key(
    options: SamplingOptions = GREEDY,
    prompts: list[list[int]] = PROMPT,
    endpoint: str = "/v1/chat/completions",
    identity: str = "model@sha256:1",
    namespace: str | None = None,
) -> str:
    return cache_key("p", "m", identity, endpoint, [Prompt(p) for p in prompts], options, namespace)


@pytest.mark.parametrize(
    ("options", "policy", "expected"),
    [
        (GREEDY, "deterministic", True),
        (SamplingOptions(max_tokens=16, top_k=1), "deterministic", True),
        (SamplingOptions(max_tokens=16, seed=7), "deterministic", True),
        (SamplingOptions(max_tokens=16), "deterministic", False),
        (SamplingOptions(max_tokens=16), "all", True),
        (GREEDY, "off", False),
    ],
)
def test_policy_decides_what_may_be_cached(
    options: SamplingOptions, policy: str, expected: bool
) -> None:
    assert is_cacheable(options, policy) is expected  # type: ignore[arg-type]


def test_key_is_versioned_namespaced_by_model_and_carries_a_full_sha256() -> None:
    prefix, kind, version, model, digest = key().split(":")
    assert (prefix, kind, version, model) == ("p", "cache", "v1", "m")
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_key_is_stable_for_equal_inputs() -> None:
    assert key() == key(dataclasses.replace(GREEDY), [list(PROMPT[0])])


def test_every_sampling_option_changes_the_key() -> None:
    changed = {
        "max_tokens": 17,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "n": 2,
        "stop": ("x",),
        "seed": 1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "repetition_penalty": 1.1,
        "logprobs": 0,
        "ignore_eos": True,
        "min_tokens": 1,
        "structured": StructuredOutput(json='{"type":"object"}'),
        "logit_bias": ((5, -100.0),),
        "prompt_logprobs": 0,
        "max_tokens_given": False,
    }
    assert set(changed) == {f.name for f in dataclasses.fields(SamplingOptions)}
    keys = {key(dataclasses.replace(GREEDY, **{name: value})) for name, value in changed.items()}
    assert len(keys) == len(changed) and key() not in keys


def test_each_structured_constraint_changes_the_key() -> None:
    constraints = [
        StructuredOutput(json='{"type":"object"}'),
        StructuredOutput(json='{"type":"array"}'),
        StructuredOutput(json='{"type":"object"}', compact_whitespace=False),
        StructuredOutput(json_object=True),
        StructuredOutput(regex="a+"),
        StructuredOutput(choice=("a", "b")),
        StructuredOutput(grammar='root ::= "a"'),
    ]
    keys = {key(dataclasses.replace(GREEDY, structured=c)) for c in constraints}
    assert len(keys) == len(constraints)


def test_prompt_endpoint_model_and_namespace_change_the_key() -> None:
    variants = [
        key(prompts=[[1, 2, 3, 401]]),
        key(prompts=[[1, 2], [3, 400]]),  # same ids, other prompt boundaries
        key(endpoint="/v1/completions"),
        key(identity="model@sha256:2"),
        key(namespace="key-0123456789ab"),
    ]
    assert len(set(variants)) == len(variants) and key() not in variants


def test_ttl_follows_observed_latency_by_the_table() -> None:
    rule = TtlRule(base=100, minimum=1, maximum=1000, jitter=0)
    policy = TtlPolicy(rule)
    assert policy.effective() == 100  # nothing observed yet
    policy.observe(0.05)
    assert policy.effective() == 300
    policy.observe(0.5)  # average now 0.2*0.5 + 0.8*0.05 = 0.14: still fast
    assert policy.latency == pytest.approx(0.14) and policy.effective() == 300
    for _ in range(10):
        policy.observe(0.5)
    assert 0.2 < policy.latency < 0.8 and policy.effective() == 100  # type: ignore[operator]
    for _ in range(20):
        policy.observe(5.0)
    assert policy.effective() == 50


def test_ttl_is_clamped_then_jittered_within_ten_percent() -> None:
    policy = TtlPolicy(TtlRule(base=100, minimum=1, maximum=200), rng=random.Random(1))
    policy.observe(0.01)  # 3 x 100, clamped to 200
    assert policy.effective() == 200
    samples = [policy.sample_ms() for _ in range(2000)]
    assert min(samples) >= 180_000 and max(samples) <= 220_000
    assert max(samples) - min(samples) > 30_000, "jitter spreads expiries"
    assert TtlPolicy(TtlRule(base=1, minimum=30, maximum=60, jitter=0)).effective() == 30


def completion(logprobs: bool = False) -> Completion:
    choice = ChoiceState(0)
    for text in ("Hel", "lo", " world"):
        lps = [TokenLogprob(text, -0.5, (("a", -1.0),))] if logprobs else None
        choice.add(ChoiceDelta(0, text, 1, None, lps))
    choice.finish_reason = "stop"
    return Completion([choice], prompt_tokens=9)


@pytest.mark.parametrize("logprobs", [False, True])
def test_entry_round_trips_deltas_counts_and_logprobs(logprobs: bool) -> None:
    original = completion(logprobs)
    restored, created = decode_entry("k", encode_entry("k", original, 1234.5))
    assert created == 1234.5
    assert (
        restored.usage
        == original.usage
        == {
            "prompt_tokens": 9,
            "completion_tokens": 3,
            "total_tokens": 12,
        }
    )
    (choice,) = restored.choices
    assert choice.text_parts == ["Hel", "lo", " world"] and choice.finish_reason == "stop"
    assert [(d.text, d.logprobs) for d in choice.deltas()] == [
        (d.text, d.logprobs) for d in original.choices[0].deltas()
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b'{"version": 1}',
        b"[1, 2, 3]",
        b'{"version": 1, "key": "k", "created": 1, "prompt_tokens": -1, "choices": []}',
    ],
)
def test_undecodable_entries_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        decode_entry("k", data)


def test_entries_for_another_key_or_version_are_refused() -> None:
    data = encode_entry("k", completion(), 1.0)
    with pytest.raises(CorruptEntryError):
        decode_entry("other", data)
    with pytest.raises(CorruptEntryError):
        decode_entry("k", data.replace(b'"version":1', b'"version":2'))


async def test_memory_store_is_bounded_in_bytes_and_evicts_least_recently_used() -> None:
    store = MemoryStore(max_bytes=1000)
    for i in range(10):
        await store.set(f"k{i}", b"x" * 198, ttl_ms=60_000)  # 200 bytes with the key
        assert store.size_bytes <= 1000
    assert len(store) == 5 and await store.get("k4") is None
    assert await store.get("k5") is not None  # now the most recently used
    await store.set("k10", b"x" * 197, ttl_ms=60_000)
    assert await store.get("k5") is not None and await store.get("k6") is None
    await store.set("huge", b"x" * 2000, ttl_ms=60_000)
    assert await store.get("huge") is None and store.size_bytes <= 1000


async def test_memory_store_expires_entries() -> None:
    now = [100.0]
    store = MemoryStore(max_bytes=1000, clock=lambda: now[0])
    await store.set("k", b"v", ttl_ms=1500)
    now[0] += 1.4
    assert await store.get("k") == b"v"
    now[0] += 0.2
    assert await store.get("k") is None and store.size_bytes == 0
