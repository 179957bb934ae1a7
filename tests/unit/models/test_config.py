"""The models file: what it may hold, and every mistake refused with the entry named."""

from __future__ import annotations

import textwrap

import pytest

from sluicegate.models.config import ModelsFileError, check_entries, parse_models_file


def parsed(text: str) -> list[str]:
    return [e.name for e in parse_models_file(textwrap.dedent(text))]


def refused(text: str) -> str:
    with pytest.raises(ModelsFileError) as caught:
        parse_models_file(textwrap.dedent(text), "models.yaml")
    return str(caught.value)


def test_the_issues_example_is_read_as_written() -> None:
    entries = parse_models_file(
        textwrap.dedent(
            """
            models:
              - name: llama-8b
                aliases: [default, gpt-4o-mini]
                upstreams:
                  - url: http://10.0.0.1:8000/v1
                    weight: 2
                  - url: http://10.0.0.2:8000/v1/
                api_key_env: LLAMA_KEY
                tokenizer: /models/llama-8b
                fallbacks: [qwen-7b]
              - name: qwen-7b
                upstreams: [{url: http://10.0.0.3:8000/v1}]
                rate_limit: {requests_per_minute: 60}
              - name: smol
                engine: local
            """
        )
    )
    llama, qwen, smol = entries
    assert [(u.url, u.weight) for u in llama.upstreams] == [
        ("http://10.0.0.1:8000/v1", 2.0),
        ("http://10.0.0.2:8000/v1", 1.0),
    ]
    assert llama.aliases == ["default", "gpt-4o-mini"] and llama.fallbacks == ["qwen-7b"]
    assert llama.api_key_env == "LLAMA_KEY" and llama.tokenizer == "/models/llama-8b"
    assert qwen.rate_limit is not None and qwen.rate_limit.requests_per_minute == 60
    assert smol.is_local and not llama.is_local


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "models:\n  - {name: a, upstreams: [{url: 'http://h/v1'}]}\n"
            "  - {name: a, upstreams: [{url: 'http://g/v1'}]}\n",
            "model 'a': 'a' is already the name of model 'a'",
        ),
        (
            "models:\n  - {name: a, aliases: [x], upstreams: [{url: 'http://h/v1'}]}\n"
            "  - {name: b, aliases: [x], upstreams: [{url: 'http://g/v1'}]}\n",
            "model 'b': 'x' is already the name of an alias of model 'a'",
        ),
        (
            "models:\n  - {name: a, aliases: [b], upstreams: [{url: 'http://h/v1'}]}\n"
            "  - {name: b, upstreams: [{url: 'http://g/v1'}]}\n",
            "model 'b': 'b' is already the name of an alias of model 'a'",
        ),
        (
            "models:\n  - {name: a, fallbacks: [nope], upstreams: [{url: 'http://h/v1'}]}\n",
            "model 'a': fallback 'nope' is no model",
        ),
        (
            "models:\n  - {name: a, fallbacks: [b], upstreams: [{url: 'http://h/v1'}]}\n"
            "  - {name: b, fallbacks: [c], upstreams: [{url: 'http://g/v1'}]}\n"
            "  - {name: c, fallbacks: [a], upstreams: [{url: 'http://f/v1'}]}\n",
            "model 'a': its fallbacks lead back to it (a -> b -> c -> a)",
        ),
        (
            "models:\n  - {name: a, fallbacks: [a], upstreams: [{url: 'http://h/v1'}]}\n",
            "model 'a': its fallbacks lead back to it (a -> a)",
        ),
        (
            "models:\n  - {name: a, aliases: [al], upstreams: [{url: 'http://h/v1'}]}\n"
            "  - {name: b, fallbacks: [al], upstreams: [{url: 'http://g/v1'}]}\n",
            "fallback 'al' is no model ('al' is an alias of model 'a': name the model)",
        ),
        ("models:\n  - {name: a}\n", "model 'a': give either `upstreams` or `engine: local`"),
        (
            "models:\n  - {name: a, engine: local, upstreams: [{url: 'http://h/v1'}]}\n",
            "model 'a': give either `upstreams` or `engine: local`",
        ),
        (
            "models:\n  - {name: a, engine: local}\n  - {name: b, engine: local}\n",
            "one in-process engine at most",
        ),
        (
            "models:\n  - {name: a, engine: local, tokenizer: /t}\n",
            "model 'a': tokenizer, upstream_model, api_key_env, reasoning_parser and images "
            "are for upstreams",
        ),
        (
            "models:\n  - {name: a, engine: local, reasoning_parser: qwen3}\n",
            "reasoning_parser and images are for upstreams; the local engine is configured by "
            "the SLUICEGATE_* engine settings",
        ),
        (
            "models:\n  - {name: a, engine: local, images: false}\n",
            "images are for upstreams",
        ),
        (
            "models:\n  - {name: a, upstreams: [{url: 'http://h/v1'}], reasoning_parser: qwen3}\n",
            "model 'a': reasoning_parser needs the model's `tokenizer`",
        ),
        (
            "models:\n  - {name: a, upstreams: [{url: 'http://h/v1'}], tokenizer: /t,"
            " reasoning_parser: qwen3, kind: embedding}\n",
            "model 'a': reasoning_parser is for chat models",
        ),
        (
            "models:\n  - {name: a, upstreams: [{url: 'http://h:8000'}]}\n",
            "model 'a', upstreams.0.url: is not a base URL ending in /v1",
        ),
        (
            "models:\n  - {name: a, upstream: [{url: 'http://h/v1'}]}\n",
            "model 'a', upstream: Extra inputs are not permitted",
        ),
        (
            "models:\n  - {name: 'two words', upstreams: [{url: 'http://h/v1'}]}\n",
            "model 'two words', name: 'two words' is not a model name",
        ),
        (
            "models:\n  - {name: a, upstreams: [{url: 'http://h/v1', weight: 0}]}\n",
            "model 'a', upstreams.0.weight: Input should be greater than 0",
        ),
        ("models: []\n", "models: List should have at least 1 item"),
        ("models: [\n", "is not valid YAML"),
        ("- a\n- b\n", "Input should be a valid dictionary"),
    ],
)
def test_a_mistake_stops_start_up_naming_the_entry(text: str, says: str) -> None:
    message = refused(text)
    assert message.startswith("models.yaml")
    assert says in message, message


def test_a_name_taken_by_an_adapter_of_the_engine_is_refused() -> None:
    entries = parse_models_file("models:\n  - {name: smol, engine: local}\n")
    with pytest.raises(ModelsFileError, match="'smol' is already the name of an adapter"):
        check_entries(entries, reserved=["smol"])


def test_fallbacks_may_share_a_model_without_a_cycle() -> None:
    assert parsed(
        """
        models:
          - {name: a, fallbacks: [b, c], upstreams: [{url: 'http://a/v1'}]}
          - {name: b, fallbacks: [c], upstreams: [{url: 'http://b/v1'}]}
          - {name: c, upstreams: [{url: 'http://c/v1'}]}
        """
    ) == ["a", "b", "c"]


def test_an_upstream_entry_takes_a_reasoning_parser_with_its_tokenizer() -> None:
    (entry,) = parse_models_file(
        "models:\n  - {name: r1, upstreams: [{url: 'http://h/v1'}], tokenizer: /models/r1,"
        " reasoning_parser: deepseek_r1}\n"
    )
    assert (entry.reasoning_parser, entry.tokenizer) == ("deepseek_r1", "/models/r1")
