"""Hypothesis-generated hostile bodies against the real gateway and engine.

Huge strings, deep nesting, wrong types, invalid UTF-8, lone UTF-16 surrogates, NaN and
Infinity, negative and absurd numbers (past int32 and int64), too many or too long stop
strings, unknown fields, empty messages. Every answer is below 500 and in OpenAI's error
shape when it is an error; the server stays healthy. (Bodies that happen to be valid carry a
small max_tokens, so none generates for long.)
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import MODEL_NAME

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
    # A float with an integer's value reads as that integer (5.2e16 is 52...0 tokens): the
    # large ones that fit would generate long, as above, so they are left out.
    st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda f: not (f.is_integer() and 4 < f < 2**63)
    ),
    # Not digits: pydantic reads "99999" as a number, and a valid body must stay short.
    st.text(alphabet="abc xyz-", max_size=5),
)
# Where the engine's integer types end (int32 for top_k, int64 and uint64 for the rest).
edge_integers = st.sampled_from(
    [2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]
)
numbers = st.one_of(max_tokens, edge_integers, st.none())
huge_text = st.builds(lambda n, c: c * n, st.integers(0, 300_000), st.sampled_from("aé字\x00 "))
# Half of a UTF-16 pair: json.dumps writes it as a `\ud800`-style escape.
lone_surrogates = st.builds(
    lambda a, s, b: a + s + b,
    st.text(max_size=5),
    st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]),
    st.text(max_size=5),
)
texts = st.one_of(st.text(max_size=200), lone_surrogates)
stops = st.one_of(
    json_values,
    lone_surrogates,
    st.lists(texts, max_size=8),
    st.integers(1, 200_000).map(lambda k: [f"s{i}" for i in range(k)]),
    st.integers(1, 5000).map(lambda k: "x" * k),
)
content = st.one_of(
    texts,
    huge_text,
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", ""]), "text": json_values | texts}
        ),
        max_size=3,
    ),
    json_values,
)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool", ""]), scalars)},
    optional={"content": content, "name": json_values | lone_surrogates},
)
chat_body = st.fixed_dictionaries(
    {
        "model": st.one_of(st.just(MODEL_NAME), scalars, lone_surrogates),
        "messages": st.one_of(st.lists(message, max_size=4), json_values),
        "max_tokens": max_tokens,
    },
    optional={
        "temperature": numbers, "top_p": numbers, "top_k": numbers, "n": numbers,
        "stop": stops, "seed": numbers, "logprobs": json_values,
        "top_logprobs": numbers, "stream": st.booleans(), "presence_penalty": numbers,
        "unknown_field": json_values, "stream_options": json_values, "min_tokens": numbers,
        "user": json_values | lone_surrogates,
    },
)  # fmt: skip
completion_body = st.fixed_dictionaries(
    {
        "model": st.just(MODEL_NAME),
        "prompt": st.one_of(
            json_values,
            huge_text,
            lone_surrogates,
            st.lists(texts, min_size=1, max_size=4),
            st.lists(st.integers(-(10**9), 10**9), max_size=5),
            st.lists(edge_integers, min_size=1, max_size=3),
        ),
        "max_tokens": max_tokens,
    },
    optional={
        "logprobs": numbers,
        "echo": json_values,
        "n": numbers,
        "top_k": numbers,
        "seed": numbers,
        "min_tokens": numbers,
        "stop": stops,
    },
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
