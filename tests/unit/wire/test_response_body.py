"""The response object's parts for a run that reasoned: the reasoning item first (sealed when
asked), the usage's reasoning tokens, and reasoning items as a stored conversation keeps them."""

from __future__ import annotations

from sluicegate.wire.completion import usage, with_reasoning_details
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.response_body import identified, output_items, response_usage
from sluicegate.wire.responses import ResponsesRequest

SEAL = ReasoningSeal([b"s" * 32])
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_the_reasoning_item_comes_first_in_vllms_and_openais_shape() -> None:
    items = output_items({"reasoning": "Think.", "content": "Hi", "tool_calls": [CALL]}, False)
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call"]
    reasoning = items[0]
    assert reasoning["id"].startswith("rs_")
    assert {k: v for k, v in reasoning.items() if k != "id"} == {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Think."}],
        "encrypted_content": None,
        "status": "completed",
    }


def test_with_a_seal_the_item_carries_its_text_sealed() -> None:
    (item,) = output_items({"reasoning": "Secret.", "content": None}, False, SEAL)
    assert SEAL.open(item["encrypted_content"]) == "Secret."


def test_an_answer_that_is_all_thoughts_has_no_empty_message() -> None:
    items = output_items({"reasoning": "Only this.", "content": None}, True)
    assert [(i["type"], i["status"]) for i in items] == [("reasoning", "incomplete")]
    # Nothing at all is still one empty message; no reasoning (null or empty), no item.
    for message in ({"content": None}, {"content": "", "reasoning": None}, {"reasoning": ""}):
        assert [i["type"] for i in output_items(message, False)] == ["message"]


def test_usage_counts_the_reasoning_tokens() -> None:
    counted = response_usage(usage(5, 9, 6))
    assert counted["output_tokens"] == 9 and counted["total_tokens"] == 14
    assert counted["output_tokens_details"] == {"reasoning_tokens": 6}
    assert response_usage(with_reasoning_details(usage(5, 3)))["output_tokens_details"] == {
        "reasoning_tokens": 0
    }
    assert response_usage(usage(5, 3))["output_tokens_details"] == {"reasoning_tokens": 0}


def test_reasoning_input_items_are_stored_with_their_text_and_known_fields_only() -> None:
    sent = {
        "type": "reasoning",
        "id": "rs_client",
        "summary": [{"type": "summary_text", "text": "S", "extra": 1}],
        "content": [{"type": "reasoning_text", "text": "C"}],
        "encrypted_content": None,
        "status": None,
        "note": "dropped",
    }
    request = ResponsesRequest.model_validate({"model": "m", "input": [sent]})
    (stored,) = identified(request.input_items())
    assert stored["id"].startswith("rs_") and stored["id"] != "rs_client"
    assert {k: v for k, v in stored.items() if k != "id"} == {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "S"}],
        "content": [{"type": "reasoning_text", "text": "C"}],
        "encrypted_content": None,
        "status": "completed",
    }
    (bare,) = identified([{"type": "reasoning", "summary": []}])
    assert bare["content"] == [] and bare["summary"] == []
