"""Chat completions through real HTTP, the official SDK and the real engine."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI, OpenAI

from tests.integration.conftest import chat_prompt_tokens

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_greedy_answer_names_paris(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=32
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.object == "chat.completion"
    assert reply.model == model
    assert reply.id.startswith("chatcmpl-")


def test_stream_equals_non_streamed_text(client: OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=40
    )
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=messages,
            temperature=0,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # Order: role chunk, content deltas, finish_reason chunk, usage chunk (empty choices).
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    content_chunks = [c for c in chunks[1:-2] if c.choices[0].delta.content]
    assert len(content_chunks) > 1, "content arrives in several deltas"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()  # type: ignore[union-attr]
    assert len({c.id for c in chunks}) == 1


def test_usage_matches_the_tokenizer(client: OpenAI, model: str, tokenizer: object) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello to the world, please."},
    ]
    reply = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True
    )
    usage = reply.usage
    assert usage is not None
    assert usage.prompt_tokens == chat_prompt_tokens(tokenizer, messages)
    assert reply.choices[0].logprobs is not None
    assert usage.completion_tokens == len(reply.choices[0].logprobs.content or [])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_text_parts_are_joined_like_a_string(client: OpenAI, model: str) -> None:
    as_parts = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "What is the capital of France?"}],
            }
        ],
        temperature=0,
        max_tokens=16,
    )
    as_string = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=16
    )
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    assert as_parts.usage == as_string.usage


def test_max_tokens_gives_finish_reason_length(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_max_completion_tokens_is_honoured(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_completion_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_stop_string_ends_the_answer_before_it(client: OpenAI, model: str) -> None:
    for stop in ("Paris", ["nothing-like-this", "Paris"]):
        reply = client.chat.completions.create(
            model=model, messages=FRANCE, temperature=0, max_tokens=32, stop=stop
        )
        text = reply.choices[0].message.content or ""
        assert "Paris" not in text
        assert text.startswith("The capital of France is")
        assert reply.choices[0].finish_reason == "stop"


def test_stop_string_in_a_stream(client: OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=FRANCE, temperature=0, max_tokens=32, stop="Paris", stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" not in text and text.startswith("The capital of France is")
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_are_indexed_and_counted(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=1.0, seed=7, n=3, max_tokens=8
    )
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.message.content for c in reply.choices)
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 24
    assert reply.usage.completion_tokens >= 3


def test_n_choices_stream_each_get_role_and_finish(client: OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=FRANCE, temperature=1.0, seed=3, n=2, max_tokens=5, stream=True
        )
    )
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    finishes = [c.choices[0].index for c in chunks if c.choices[0].finish_reason]
    assert sorted(roles) == [0, 1]
    assert sorted(finishes) == [0, 1]


def test_seed_makes_sampling_repeatable(client: OpenAI, model: str) -> None:
    def sample() -> str:
        reply = client.chat.completions.create(
            model=model, messages=FRANCE, temperature=1.0, seed=1234, max_tokens=16
        )
        return reply.choices[0].message.content or ""

    assert sample() == sample()


def test_top_logprobs_are_ranked(client: OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=4, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # Greedy: the sampled token is the most likely one.
        assert entry.token == entry.top_logprobs[0].token


async def test_32_concurrent_requests_all_complete_correctly(
    aclient: AsyncOpenAI, model: str, tokenizer: object
) -> None:
    """Each request has its own prompt length and max_tokens, so any mix-up shows."""

    async def one(i: int) -> None:
        messages = [{"role": "user", "content": "Count with me: " + "one " * i}]
        kwargs = dict(model=model, messages=messages, temperature=0, max_tokens=4 + i)
        if i % 2:
            stream = await aclient.chat.completions.create(
                **kwargs,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            chunks = [c async for c in stream]
            usage = chunks[-1].usage
            assert chunks[-2].choices[0].finish_reason == "length"
        else:
            reply = await aclient.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
            usage = reply.usage
            assert reply.choices[0].finish_reason == "length"
        assert usage is not None
        assert usage.completion_tokens == 4 + i
        assert usage.prompt_tokens == chat_prompt_tokens(tokenizer, messages)

    await asyncio.gather(*(one(i) for i in range(32)))
