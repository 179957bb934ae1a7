from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluicegate.http.errors import validation_param
from sluicegate.wire.requests import ChatCompletionRequest, CompletionRequest

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_text_parts_join_with_newlines() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            **BASE,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
        }
    )
    assert request.messages[0].text() == "a\nb"


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": float("nan")},
        {"top_p": float("inf")},
        {"seed": 2**64},
        {"top_logprobs": 3},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user"}]},
        {"stop": ["ok", ""]},
        {"logit_bias": {"1": 2.0}},
        {"response_format": {"type": "json_object"}},
        {"n": 1000},
    ],
)
def test_bad_chat_requests_are_refused(extra: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({**BASE, **extra})


def test_unknown_fields_are_ignored() -> None:
    assert ChatCompletionRequest.model_validate({**BASE, "frobnicate": 1}).model == "m"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    request = ChatCompletionRequest.model_validate(
        {**BASE, "max_tokens": 9, "max_completion_tokens": 4}
    )
    assert request.completion_limit() == 4


def test_logprobs_k() -> None:
    assert ChatCompletionRequest.model_validate(BASE).logprobs_k() is None
    assert ChatCompletionRequest.model_validate({**BASE, "logprobs": True}).logprobs_k() == 0
    chat = ChatCompletionRequest.model_validate({**BASE, "logprobs": True, "top_logprobs": 5})
    assert chat.logprobs_k() == 5
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 2}).logprobs_k()
        == 2
    )


@pytest.mark.parametrize("prompt", [[], [[]], ["a", []]])
def test_empty_prompts_are_refused(prompt: object) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})


@pytest.mark.parametrize("echo", [{"echo": True}, {"suffix": "x"}, {"best_of": 3}])
def test_unsupported_completion_options_are_refused(echo: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", **echo})


def test_validation_param_drops_type_parts() -> None:
    assert validation_param(("body", "messages", 0, "content", "str")) == "messages.0.content"
    assert (
        validation_param(("body", "messages", 0, "content", "list[TextPart]", 0, "type"))
        == "messages.0.content.0.type"
    )
    assert validation_param(("body",)) == ""
