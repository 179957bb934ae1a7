"""Hypothesis-generated hostile bodies against the real gateway and engine.

Huge strings, deep nesting, wrong types, invalid UTF-8, NaN and Infinity, negative and absurd
numbers, unknown fields, empty messages. Every answer is below 500 and in OpenAI's error
shape when it is an error; the server stays healthy. (Bodies that happen to be valid carry a
small max_tokens, so none generates for long.)
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.server import MODEL_NAME

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Never null: a valid body without max_tokens may generate up to the whole context.
max_tokens = st.one_of(
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=-(10**12), max_value=0),
    # Beyond int64: refused. (Large values that fit are clamped to the context and may
    # generate that long; tests/integration/test_budget.py covers them.)
    st.integers(min_value=2**63, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
numbers = st.one_of(max_tokens, st.none())
huge_text = st.builds(lambda n, c: c * n, st.integers(0, 300_000), st.sampled_from("aé字\x00 "))
content = st.one_of(
    st.text(max_size=200),
    huge_text,
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", ""]), "text": json_values}
        ),
        max_size=3,
    ),
    json_values,
)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool", ""]), scalars)},
    optional={"content": content, "name": json_values},
)
chat_body = st.fixed_dictionaries(
    {
        "model": st.one_of(st.just(MODEL_NAME), scalars),
        "messages": st.one_of(st.lists(message, max_size=4), json_values),
        "max_tokens": max_tokens,
    },
    optional={
        "temperature": numbers, "top_p": numbers, "top_k": numbers, "n": numbers,
        "stop": json_values, "seed": numbers, "logprobs": json_values,
        "top_logprobs": numbers, "stream": st.booleans(), "presence_penalty": numbers,
        "unknown_field": json_values, "stream_options": json_values,
    },
)  # fmt: skip
completion_body = st.fixed_dictionaries(
    {
        "model": st.just(MODEL_NAME),
        "prompt": st.one_of(
            json_values, huge_text, st.lists(st.integers(-(10**9), 10**9), max_size=5)
        ),
        "max_tokens": max_tokens,
    },
    optional={"logprobs": numbers, "echo": json_values, "n": numbers},
)


def encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


raw_bodies = st.one_of(
    chat_body.map(lambda b: ("/v1/chat/completions", encode(b))),
    completion_body.map(lambda b: ("/v1/completions", encode(b))),
    st.tuples(
        st.sampled_from(["/v1/chat/completions", "/v1/completions"]), st.binary(max_size=300)
    ),
    st.integers(1, 200_000).map(
        lambda depth: ("/v1/chat/completions", b"[" * depth + b"]" * depth)
    ),
    st.integers(1, 200_000).map(
        lambda depth: ("/v1/chat/completions", b'{"model": "x", "messages": ' + b"[" * depth)
    ),
    st.binary(min_size=1, max_size=50).map(
        lambda junk: ("/v1/chat/completions", b'{"model": "' + junk + b'", "messages": []}')
    ),
)


def test_hostile_bodies_never_get_a_5xx(base_url: str) -> None:
    client = httpx.Client(base_url=base_url, timeout=60)
    statuses: list[int] = []

    @settings(
        max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(raw_bodies)
    def check(case: tuple[str, bytes]) -> None:
        path, body = case
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        statuses.append(response.status_code)
        assert response.status_code < 500, (body[:200], response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}

    check()
    print(f"hostile bodies: {len(statuses)} cases, statuses {sorted(set(statuses))}")
    assert len(statuses) >= 400
    assert httpx.get(f"{base_url}/health").status_code == 200
    healthy = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
        },
    )
    assert healthy.status_code == 200
