"""Text completions through real HTTP and the official SDK."""

from __future__ import annotations

from openai import OpenAI


def test_single_prompt(client: OpenAI, model: str, tokenizer: object) -> None:
    prompt = "The capital of France is"
    reply = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=5)
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt))  # type: ignore[attr-defined]


def test_list_of_prompts_gives_one_choice_each(client: OpenAI, model: str) -> None:
    prompts = ["The sky is", "Once upon a time"]
    batch = client.completions.create(model=model, prompt=prompts, temperature=0, max_tokens=6)
    assert [c.index for c in batch.choices] == [0, 1]
    for prompt, choice in zip(prompts, batch.choices, strict=True):
        alone = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=6)
        assert choice.text == alone.choices[0].text


def test_token_id_prompt_equals_text_prompt(client: OpenAI, model: str, tokenizer: object) -> None:
    prompt = "Once upon a time"
    ids = tokenizer.encode(prompt)  # type: ignore[attr-defined]
    by_ids = client.completions.create(model=model, prompt=ids, temperature=0, max_tokens=6)
    by_text = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=6)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_stream_equals_non_streamed_text(client: OpenAI, model: str) -> None:
    prompt = "My favourite food is"
    whole = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12)
    chunks = list(
        client.completions.create(
            model=model,
            prompt=prompt,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()  # type: ignore[union-attr]


def test_logprobs_offsets_follow_the_text(client: OpenAI, model: str) -> None:
    reply = client.completions.create(
        model=model, prompt="One, two, three,", temperature=0, max_tokens=6, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.text_offset
    assert "".join(logprobs.tokens) == reply.choices[0].text
    for token, offset in zip(logprobs.tokens, logprobs.text_offset, strict=True):
        assert reply.choices[0].text[offset : offset + len(token)] == token
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])


def test_max_tokens_and_stop(client: OpenAI, model: str) -> None:
    reply = client.completions.create(model=model, prompt="1, 2, 3,", temperature=0, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    stopped = client.completions.create(
        model=model, prompt="1, 2, 3, 4,", temperature=0, max_tokens=20, stop=[","]
    )
    assert "," not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_models_lists_the_served_model(client: OpenAI, model: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model]
    assert client.models.retrieve(model).id == model
