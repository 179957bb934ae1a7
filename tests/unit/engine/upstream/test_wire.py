"""Upstream bodies and streams: what is sent, and how events become engine steps."""

from __future__ import annotations

import json

from sluicegate.engine.protocol import ChatPrompt, Prompt, SamplingOptions, StructuredOutput
from sluicegate.engine.upstream.tool_calls import (
    RS,
    UpstreamToolParser,
    encode_call_fragment,
    encode_content,
    reads_records,
)
from sluicegate.engine.upstream.wire import StreamReader, request_body
from sluicegate.wire.tool_calls import whole_calls
from sluicegate.wire.tools import ToolSetup


def test_a_chat_body_sends_only_what_differs_from_openais_defaults() -> None:
    chat = ChatPrompt(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    }
                ],
            },
        ],
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    options = SamplingOptions(
        max_tokens=9, temperature=0.0, top_k=5, stop=("x",), logit_bias=((3, -100.0),)
    )
    path, body = request_body("m", Prompt([1, 2], chat=chat), options)
    assert path == "/chat/completions"
    assert body["max_tokens"] == 9 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["top_k"] == 5 and body["stop"] == ["x"]
    assert body["logit_bias"] == {"3": -100.0}
    assert "top_p" not in body and "min_p" not in body and "n" not in body
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    # Arguments go back to JSON text, as OpenAI's wire has them.
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'


def test_completion_prompts_go_as_text_when_whole_else_as_ids() -> None:
    options = SamplingOptions(max_tokens=4, max_tokens_given=False)
    path, body = request_body("m", Prompt([5, 6], text="The sky"), options, False)
    assert path == "/completions" and body["prompt"] == "The sky" and "max_tokens" not in body
    _, body = request_body("m", Prompt([5, 6]), options)
    assert body["prompt"] == [5, 6]


def test_structured_outputs_map_to_response_format_or_vllms_own() -> None:
    schema = StructuredOutput(json='{"type":"object"}')
    _, body = request_body("m", Prompt([1]), SamplingOptions(max_tokens=1, structured=schema))
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    regex = StructuredOutput(regex="[ab]+")
    _, body = request_body("m", Prompt([1]), SamplingOptions(max_tokens=1, structured=regex))
    assert body["structured_outputs"] == {"regex": "[ab]+"}


def _chunk(content: str | None = None, finish: str | None = None, **delta: object) -> str:
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"choices": [choice]})


def test_the_finish_is_held_until_the_usage_settles_the_count() -> None:
    reader = StreamReader(choices=1)
    assert reader.feed(_chunk("", role="assistant")) is None  # nothing to pass on
    first = reader.feed(_chunk("Hel"))
    assert first is not None and first.choices[0].text == "Hel"
    assert reader.feed(_chunk("lo", finish="length")) is None  # held
    usage = {"prompt_tokens": 7, "completion_tokens": 5}
    assert reader.feed(json.dumps({"choices": [], "usage": usage})) is None
    assert reader.feed("[DONE]") is None and reader.done
    last = reader.finish()
    assert last.finished and last.prompt_tokens == 7
    (delta,) = last.choices
    assert delta.text == "lo" and delta.finish_reason == "length"
    assert 1 + delta.num_tokens == 5  # counted 2, the upstream says 5


def test_streamed_tool_calls_become_the_same_calls_as_the_whole_text() -> None:
    reader = StreamReader(choices=1, records=True)
    call = {"index": 0, "id": "x", "function": {"name": "get", "arguments": '{"ci'}}
    more = {"index": 0, "function": {"arguments": 'ty": "Paris"}'}}
    texts = []
    for data in (_chunk(tool_calls=[call]), _chunk(tool_calls=[more]), _chunk(finish="tool_calls")):
        step = reader.feed(data)
        texts += [c.text for c in step.choices] if step else []
    texts += [c.text for c in reader.finish().choices]
    text = "".join(texts)
    setup = ToolSetup(({"type": "function", "function": {"name": "get"}},), "required")
    stream = whole_calls(setup, UpstreamToolParser(), text)
    assert [(name, args) for _, name, args in stream.calls()] == [("get", '{"city": "Paris"}')]
    assert stream.content() is None


def test_records_split_anywhere_still_parse_and_content_keeps_its_separators() -> None:
    text = encode_content("a\x1eb") + encode_call_fragment(0, "f", "{}")
    parser = UpstreamToolParser()
    for cut in range(len(text) + 1):
        stream = parser.stream(())
        first, second = stream.feed(text[:cut]), stream.feed(text[cut:])
        content = (first.content or "") + (second.content or "")
        assert content == "a\x1eb"
        assert [c.name for c in first.calls + second.calls] == ["f"]


def test_records_are_written_only_where_the_upstream_tool_parser_reads_them() -> None:
    messages = [{"role": "user", "content": "hi"}]
    tools = ({"type": "function", "function": {"name": "get"}},)
    assert not reads_records(None)  # a completion
    assert not reads_records(ChatPrompt(messages))
    assert not reads_records(ChatPrompt(messages, tools, "none"))
    assert reads_records(ChatPrompt(messages, tools, "auto"))
    assert reads_records(ChatPrompt(messages, tools, {"type": "function", "function": {}}))
    content = f"a{RS}b{RS}c"
    plain = StreamReader(choices=1).feed(_chunk(content))
    assert plain is not None and plain.choices[0].text == content  # as it came
    recorded = StreamReader(choices=1, records=True).feed(_chunk(content))
    assert recorded is not None and recorded.choices[0].text == encode_content(content)


def test_events_of_one_read_become_one_step_per_choice() -> None:
    reader = StreamReader(choices=1)
    lines = [
        "data: " + _chunk("a"),
        "",
        "data: " + _chunk("b"),
        ": comment",
        "data: " + _chunk("c"),
    ]
    step = reader.feed_lines(lines)
    assert step is not None
    (delta,) = step.choices
    assert (delta.text, delta.num_tokens) == ("abc", 3)
    assert reader.feed_lines(["data: [DONE]", "data: " + _chunk("late")]) is None
    assert reader.done


def test_events_orjson_refuses_are_read_as_pythons_json_reads_them() -> None:
    reader = StreamReader(choices=1)
    surrogate = '{"choices":[{"index":0,"delta":{"content":"a\\ud800"}}]}'
    step = reader.feed_lines(["data: " + surrogate])
    assert step is not None and step.choices[0].text == "a\ud800"
    nan = '{"choices":[{"index":0,"delta":{"content":"b"},"logprobs":null}],"x":NaN}'
    step = reader.feed_lines(["data: " + nan])
    assert step is not None and step.choices[0].text == "b"


def test_error_bodies_of_every_shape_give_their_message() -> None:
    from sluicegate.engine.upstream.wire import error_fields

    openai = b'{"error": {"message": "bad", "type": "x", "param": "n", "code": 7}}'
    assert error_fields(openai) == ("bad", "n", "7")
    assert error_fields(b'{"detail": "Not Found"}') == ("Not Found", None, None)
    assert error_fields(b'["not", "an", "object"]') == (None, None, None)
    assert error_fields(b"plain text") == ("plain text", None, None)
    assert error_fields(b"") == (None, None, None)
