"""Cache keys: what may be cached, and what each key is made of."""

from __future__ import annotations

import dataclasses

import pytest

from sluicegate.cache.key import cache_key, is_cacheable
from sluicegate.engine.protocol import (
    Prompt,
    ReasoningOptions,
    SamplingOptions,
    StructuredOutput,
)

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
        "reasoning": ReasoningOptions(include=False),
    }
    unkeyed = {"pass_through"}  # how the output is handed on, not what it is
    assert set(changed) == {f.name for f in dataclasses.fields(SamplingOptions)} - unkeyed
    keys = {key(dataclasses.replace(GREEDY, **{name: value})) for name, value in changed.items()}
    assert len(keys) == len(changed) and key() not in keys
    assert key(dataclasses.replace(GREEDY, pass_through=True)) == key()


def test_each_reasoning_option_changes_the_key() -> None:
    options = [
        ReasoningOptions(),
        ReasoningOptions(include=False),
        ReasoningOptions(effort="low"),
        ReasoningOptions(template_kwargs='{"enable_thinking": false}'),
        ReasoningOptions(budget=8),
    ]
    keys = {key(dataclasses.replace(GREEDY, reasoning=r)) for r in options}
    assert len(keys) == len(options) and key() not in keys


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
