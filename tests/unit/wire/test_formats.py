"""Completion logprobs as vLLM's server renders them: an unscored first prompt token, and
`text_offset` counted over the reported tokens, in responses and in streams alike."""

from __future__ import annotations

import json

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob
from sluicegate.wire.completion import Collector
from sluicegate.wire.events import EventWriter
from sluicegate.wire.formats import completion_format

PROMPT = [TokenLogprob("The", None), TokenLogprob(" sky", -2.0, ((" sky", -2.0),))]
OUTPUT = [TokenLogprob(" is", -0.1, ((" is", -0.1),))]


def test_the_unscored_first_token_renders_as_null() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "The sky", 0, None, PROMPT))
    collector.add(ChoiceDelta(0, " is", 1, "length", OUTPUT))
    body = completion_format("m", False).response(collector.completion(2))
    logprobs = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == "The sky is"
    assert logprobs == {
        "tokens": ["The", " sky", " is"],
        "token_logprobs": [None, -2.0, -0.1],
        "top_logprobs": [None, {" sky": -2.0}, {" is": -0.1}],
        "text_offset": [0, 3, 7],
    }


def test_stream_offsets_follow_the_tokens_not_the_text() -> None:
    fmt = completion_format("m", False)
    writer = EventWriter(fmt)
    # Text held back (a possible stop string) lags the tokens it came with.
    events = [
        *writer.events(ChoiceDelta(0, "The sky", 0, None, PROMPT)),
        *writer.events(ChoiceDelta(0, "", 1, None, OUTPUT)),
        *writer.events(ChoiceDelta(0, " is", 1, None, [TokenLogprob(".", -0.5)])),
    ]
    offsets = [
        json.loads(e.removeprefix(b"data: "))["choices"][0]["logprobs"]["text_offset"]
        for e in events
    ]
    assert offsets == [[0, 3], [7], [10]]
