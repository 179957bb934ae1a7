"""Images on the upstream wire: each image part of a chat goes as an `image_url` part with the
bytes the gateway read inline (a `data:` URI, so an upstream never fetches), or with
`forward_urls` by the URL the client gave when the gateway fetched it; a count of the prompt's
text (the upstream's `/tokenize`) sends no image."""

from __future__ import annotations

import base64

from sluicegate.engine.protocol import ChatPrompt, Prompt, PromptImage, SamplingOptions
from sluicegate.engine.upstream.wire import request_body, wire_message

FETCHED = PromptImage("a" * 64, "image/png", b"\x89PNG one", None, "high", "http://h/a.png")
INLINE = PromptImage("b" * 64, "image/jpeg", b"\xff\xd8 two", None)
MESSAGES = [
    {"role": "system", "content": "brief"},
    {
        "role": "user",
        "content": "Compare\nwith",
        "parts": [
            {"type": "text", "text": "Compare"},
            {"type": "image"},
            {"type": "text", "text": "with"},
            {"type": "image"},
        ],
    },
]


def body(forward_urls: bool = False) -> dict[str, object]:
    prompt = Prompt([], chat=ChatPrompt(MESSAGES), images=(FETCHED, INLINE))
    _, sent = request_body("m", prompt, SamplingOptions(max_tokens=4), forward_urls=forward_urls)
    return sent


def test_images_go_inline_in_their_places() -> None:
    user = body()["messages"][1]  # type: ignore[index]
    assert user["content"] == [
        {"type": "text", "text": "Compare"},
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(b"\x89PNG one").decode(),
                "detail": "high",
            },
        },
        {"type": "text", "text": "with"},
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8 two").decode()
            },
        },
    ]
    assert "parts" not in user


def test_forwarding_sends_the_fetched_ones_by_url_and_the_rest_inline() -> None:
    content = body(forward_urls=True)["messages"][1]["content"]  # type: ignore[index]
    assert content[1]["image_url"]["url"] == "http://h/a.png"
    assert content[3]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_a_count_of_the_text_sends_no_image() -> None:
    assert wire_message(MESSAGES[1]) == {"role": "user", "content": "Compare\nwith"}
