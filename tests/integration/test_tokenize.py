"""`/tokenize` and `/detokenize` over real HTTP, checked against the model's own tokenizer."""

from __future__ import annotations

from typing import Any

import httpx

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello there!"},
]


def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=60)


def test_tokenize_text_matches_the_model_tokenizer(
    base_url: str, model: str, tokenizer: Any
) -> None:
    prompt = "Tokenizers split text into pieces, e.g. 'unbelievable'."
    response = post(
        base_url, "/tokenize", {"model": model, "prompt": prompt, "return_token_strs": True}
    )
    assert response.status_code == 200, response.text
    ids = tokenizer.encode(prompt)
    assert response.json() == {
        "count": len(ids),
        "max_model_len": 2048,
        "tokens": ids,
        "token_strs": tokenizer.convert_ids_to_tokens(ids),
    }


def test_tokenize_messages_matches_the_chat_template(base_url: str, tokenizer: Any) -> None:
    for options in (
        {},
        {"add_generation_prompt": False},
        {"add_generation_prompt": False, "continue_final_message": True},
    ):
        response = post(base_url, "/tokenize", {"messages": MESSAGES, **options})
        assert response.status_code == 200, response.text
        text = tokenizer.apply_chat_template(
            MESSAGES,
            tokenize=False,
            add_generation_prompt=options.get("add_generation_prompt", True),
            continue_final_message=options.get("continue_final_message", False),
        )
        assert response.json()["tokens"] == tokenizer.encode(text, add_special_tokens=False)


def test_detokenize_round_trips(base_url: str, model: str) -> None:
    text = "Round trips: ünïcode, emoji 🚰, and spaces  too."
    tokens = post(base_url, "/tokenize", {"prompt": text}).json()["tokens"]
    response = post(base_url, "/detokenize", {"model": model, "tokens": tokens})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": text}


def test_detokenize_takes_no_more_ids_than_the_context_length(base_url: str) -> None:
    longest = post(base_url, "/tokenize", {"prompt": "a"}).json()["max_model_len"]
    assert post(base_url, "/detokenize", {"tokens": [1] * longest}).status_code == 200
    response = post(base_url, "/detokenize", {"tokens": [1] * (longest + 1)})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tokens" and str(longest) in error["message"]


def test_tokenize_errors(base_url: str) -> None:
    cases: list[tuple[str, dict[str, Any], int, str | None]] = [
        ("/detokenize", {"tokens": [1, 49152]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
        ("/tokenize", {"model": "gpt-4", "prompt": "a"}, 404, "model"),
        ("/tokenize", {"prompt": 1}, 400, "prompt"),
    ]
    for path, body, status, param in cases:
        response = post(base_url, path, body)
        assert response.status_code == status, response.text
        assert response.json()["error"]["param"] == param
