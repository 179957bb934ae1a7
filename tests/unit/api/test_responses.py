"""`/v1/responses` over the real app and a fake engine, through the official `openai` SDK:
bodies, streams, the store, `previous_response_id`, key isolation and a failing store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

KEY_A, KEY_B = "sk-resp-a", "sk-resp-b"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def url(engine: FakeEngine) -> Iterator[str]:
    with serve_in_thread(fake_app(engine)) as base:
        yield base


@pytest.fixture
def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_create_returns_a_response_object_the_sdk_parses(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model=FAKE_MODEL, input="hi there", instructions="Be kind.", metadata={"t": "1"}
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.output_text == "Hello there!"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.usage.total_tokens == response.usage.input_tokens + 3
    assert response.instructions == "Be kind." and response.metadata == {"t": "1"}
    assert response.tool_choice == "auto" and response.to_dict()["store"] is True


def test_max_output_tokens_cut_is_incomplete(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model=FAKE_MODEL, input="hi", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Hello there" and response.max_output_tokens == 2


def test_stream_sends_the_standard_events_and_the_final_response(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model=FAKE_MODEL, input="hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == "Hello there!"
    assert sdk.responses.retrieve(final.id).output_text == "Hello there!"


def test_a_stored_response_is_read_then_deleted(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(model=FAKE_MODEL, input="hi")
    got = sdk.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.retrieve(created.id)
    assert caught.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(created.id)


def test_store_false_is_not_kept(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(model=FAKE_MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


def test_previous_response_id_continues_without_its_instructions(
    sdk: openai.OpenAI, engine: FakeEngine
) -> None:
    first = sdk.responses.create(model=FAKE_MODEL, input="one two", instructions="alpha beta")
    second = sdk.responses.create(model=FAKE_MODEL, input="three", previous_response_id=first.id)
    # The fake tokenizer: one id per word of "role content"; the second prompt holds the first
    # input, its output and the new input, but not the first instructions.
    words = ["user", "one", "two", "assistant", "Hello", "there!", "user", "three"]
    expected = [len(w) for w in words]
    assert engine.requests[-1][1] == expected
    assert second.previous_response_id == first.id
    assert second.usage is not None and second.usage.input_tokens == len(expected)


def test_an_unknown_previous_response_is_a_400(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model=FAKE_MODEL, input="x", previous_response_id="resp_none")
    body = caught.value.body
    assert body["param"] == "previous_response_id"  # type: ignore[index]
    assert body["code"] == "previous_response_not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"model": "other"}, "model"),
    ],
)
def test_refusals_are_400s_naming_the_parameter(
    url: str, fields: dict[str, object], param: str
) -> None:
    import httpx

    body = {"model": FAKE_MODEL, "input": "x", **fields}
    response = httpx.post(f"{url}/v1/responses", json=body)
    assert response.status_code in (400, 404)
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_a_failure_after_the_first_byte_ends_with_response_failed(engine: FakeEngine) -> None:
    engine.fail_after_words = 1
    with TestClient(fake_app(engine)) as client:
        response = client.post(
            "/v1/responses", json={"model": FAKE_MODEL, "input": "x", "stream": True}
        )
    assert response.status_code == 200
    lines = response.text.splitlines()
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[-2:] == ["error", "response.failed"]
    assert "[DONE]" not in response.text
    last = json.loads(response.text.strip().splitlines()[-1].removeprefix("data: "))
    assert last["response"]["status"] == "failed"


def test_a_cached_answer_is_stored_as_its_own_response(engine: FakeEngine) -> None:
    with TestClient(fake_app(engine)) as client:
        body = {"model": FAKE_MODEL, "input": "x", "temperature": 0}
        first = client.post("/v1/responses", json=body)
        second = client.post("/v1/responses", json=body)
        assert second.headers["x-cache"] == "HIT" and len(engine.requests) == 1
        assert first.json()["id"] != second.json()["id"]
        stored = client.get(f"/v1/responses/{second.json()['id']}")
        assert stored.json() == second.json()


def test_a_response_stored_under_one_key_is_not_found_under_another() -> None:
    with TestClient(fake_app(api_keys=f"{KEY_A},{KEY_B}")) as client:
        a = {"authorization": f"Bearer {KEY_A}"}
        b = {"authorization": f"Bearer {KEY_B}"}
        created = client.post("/v1/responses", json={"model": FAKE_MODEL, "input": "x"}, headers=a)
        response_id = created.json()["id"]
        assert client.get(f"/v1/responses/{response_id}", headers=a).status_code == 200
        assert client.get(f"/v1/responses/{response_id}", headers=b).status_code == 404
        assert client.delete(f"/v1/responses/{response_id}", headers=b).status_code == 404
        follow = {"model": FAKE_MODEL, "input": "y", "previous_response_id": response_id}
        refused = client.post("/v1/responses", json=follow, headers=b)
        assert refused.status_code == 400
        assert client.post("/v1/responses", json=follow, headers=a).status_code == 200


def test_a_store_that_fails_is_a_503_to_read_but_creation_still_answers() -> None:
    app = fake_app(redis_url="redis://127.0.0.1:1/0", responses_redis_timeout=0.3)
    with TestClient(app) as client:
        created = client.post("/v1/responses", json={"model": FAKE_MODEL, "input": "x"})
        assert created.status_code == 200 and created.json()["status"] == "completed"
        got = client.get(f"/v1/responses/{created.json()['id']}")
        assert got.status_code == 503 and got.json()["error"]["code"] == "store_unavailable"
        follow = {"model": FAKE_MODEL, "input": "y", "previous_response_id": "resp_1"}
        assert client.post("/v1/responses", json=follow).status_code == 503


def test_input_items_list_the_conversation_a_page_at_a_time(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model=FAKE_MODEL, input="one", store=True)
    second = sdk.responses.create(
        model=FAKE_MODEL,
        input=[{"role": "user", "content": "two"}, {"role": "user", "content": "three"}],
        previous_response_id=first.id,
    )
    page = sdk.responses.input_items.list(second.id, order="asc", limit=2)
    texts = [item.content[0].text for item in page.data]  # type: ignore[union-attr,index]
    assert texts == ["one", "Hello there!"] and page.has_more
    rest = sdk.responses.input_items.list(second.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["two", "three"]  # type: ignore[union-attr,index]
    assert not rest.has_more
    newest = sdk.responses.input_items.list(second.id, limit=1)
    assert newest.data[0].content[0].text == "three"  # type: ignore[union-attr,index]
    assert all(i.id for i in [*page.data, *rest.data])


def test_the_in_process_store_keeps_only_its_byte_bound() -> None:
    with TestClient(fake_app(responses_memory_max_bytes=4000)) as client:
        ids = []
        for i in range(6):
            body = {"model": FAKE_MODEL, "input": f"question {i}"}
            ids.append(client.post("/v1/responses", json=body).json()["id"])
        found = [client.get(f"/v1/responses/{i}").status_code for i in ids]
        # Each record is about 1.3 kB: the newest ones fit, the oldest went first.
        assert found[-2:] == [200, 200] and found[0] == 404
        assert found == sorted(found, reverse=True)  # 404s, then 200s
        assert app_store_size(client) <= 4000


def app_store_size(client: TestClient) -> int:
    from sluicegate.conversation.store import MemoryResponseStore
    from sluicegate.http.state import STATE_KEY

    state = client.app_state[STATE_KEY]  # the lifespan's state, as TestClient keeps it
    assert isinstance(state.responses, MemoryResponseStore)
    return state.responses.size_bytes


def test_one_keys_large_records_do_not_push_out_another_keys() -> None:
    """Each record holds a 2 kB input (about 3 kB in all): three fit one key's bound of
    10 kB, and the whole store (64 MiB) is far from full."""
    app = fake_app(
        api_keys=f"{KEY_A},{KEY_B}",
        responses_max_entry_bytes=4096,
        responses_max_bytes_per_key=10_000,
    )
    a, b = ({"authorization": f"Bearer {key}"} for key in (KEY_A, KEY_B))
    with TestClient(app) as client:

        def store(headers: dict[str, str], i: int) -> str:
            body = {"model": FAKE_MODEL, "input": f"{i} " + "x" * 2000}
            created = client.post("/v1/responses", json=body, headers=headers)
            assert created.status_code == 200 and created.json()["store"] is True
            return str(created.json()["id"])

        kept = [store(b, i) for i in range(2)]
        mine = [store(a, i) for i in range(12)]
        assert [client.get(f"/v1/responses/{i}", headers=b).status_code for i in kept] == [200] * 2
        found = [client.get(f"/v1/responses/{i}", headers=a).status_code for i in mine]
        assert found == [404] * 9 + [200] * 3  # the oldest went first


def test_a_conversation_larger_than_the_store_takes_is_answered_with_store_false() -> None:
    app = fake_app(responses_max_entry_bytes=2048, responses_max_bytes_per_key=2048)
    with TestClient(app) as client:
        body = {"model": FAKE_MODEL, "input": "x" * 3000}
        created = client.post("/v1/responses", json=body)
        assert created.status_code == 200 and created.json()["store"] is False
        assert created.json()["output"][0]["content"][0]["text"] == "Hello there!"
        assert client.get(f"/v1/responses/{created.json()['id']}").status_code == 404
        streamed = client.post("/v1/responses", json={**body, "stream": True})
        assert '"store":false' in streamed.text.replace(" ", "")


def test_with_truncation_auto_the_fitted_conversation_is_stored() -> None:
    """64 tokens (words) of context: the older turns go, and only what the prompt held is
    kept, so that continuing sends what the model saw."""
    with TestClient(fake_app(FakeEngine(max_model_len=64))) as client:
        turns: list[dict[str, str]] = []
        for i in range(6):
            turns += [
                {"role": "user", "content": f"question {i} " + "word " * 8},
                {"role": "assistant", "content": f"answer {i}"},
            ]
        turns.append({"role": "user", "content": "last question"})
        body = {"model": FAKE_MODEL, "input": turns, "truncation": "auto", "max_output_tokens": 4}
        created = client.post("/v1/responses", json=body)
        assert created.status_code == 200
        assert int(created.headers["x-budget-messages-dropped"]) > 0
        page = client.get(f"/v1/responses/{created.json()['id']}/input_items?order=asc&limit=100")
        items = page.json()["data"]
        texts = [item["content"][0]["text"] for item in items]
        assert texts[-1] == "last question" and not texts[0].startswith("question 0")
        assert len(texts) == len(turns) - int(created.headers["x-budget-messages-dropped"])
        # The whitespace tokenizer counts each message's role and words: the stored
        # conversation is the prompt that was charged.
        prompt = sum(len(f"{i['role']} {i['content'][0]['text']}".split()) for i in items)
        assert prompt == created.json()["usage"]["input_tokens"]


PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def pictured(image_url: str) -> list[dict[str, object]]:
    content = [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": image_url, "detail": "low"},
    ]
    return [{"role": "user", "content": content}]


def test_input_images_reach_a_model_that_reads_them_and_again_with_the_conversation(
    sdk: openai.OpenAI, engine: FakeEngine
) -> None:
    engine.takes_images = True
    first = sdk.responses.create(model=FAKE_MODEL, input=pictured(PIXEL))  # type: ignore[arg-type]
    (prompt,) = engine.prompts
    assert [(i.media_type, i.detail) for i in prompt.images] == [("image/png", "low")]
    assert first.usage is not None and first.usage.input_tokens == prompt.length
    # The stored conversation keeps the image: a continuation reads it again.
    sdk.responses.create(model=FAKE_MODEL, input="And now?", previous_response_id=first.id)
    assert len(engine.prompts[1].images) == 1
    assert engine.prompts[1].images[0].digest == prompt.images[0].digest


@pytest.mark.parametrize(
    ("image_url", "words"),
    [("data:image/png;base64,bm90IGFuIGltYWdl", "not a PNG"), ("http://127.0.0.1:9/a", "loopback")],
)
def test_an_input_image_refused_names_its_part(
    url: str, engine: FakeEngine, image_url: str, words: str
) -> None:
    engine.takes_images = True
    with TestClient(fake_app(engine)) as client:
        response = client.post(
            "/v1/responses", json={"model": FAKE_MODEL, "input": pictured(image_url)}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[0].content[1]" and words in error["message"]
    assert engine.prompts == []


def test_a_text_only_model_refuses_an_input_image(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=FAKE_MODEL, input=pictured(PIXEL))  # type: ignore[arg-type]
    assert "text only" in str(refused.value) and "input[0].content[1]" in str(refused.value)
