"""Loading and unloading LoRA adapters at run time, over a fake engine whose adapters are kept
by the real `LoadedAdapters` on a stand-in for vLLM's `AsyncLLM`: who may, what is refused,
and what a loaded adapter is to the rest of the gateway."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.engine.lora import BaseModel
from sluicegate.engine.vllm_adapters import LoadedAdapters
from tests.support.fakes import FAKE_MODEL, FakeEngine, FakeLoraLLM, fake_app, models_file

ADMIN = "sk-admin-0123456789"
USER = "sk-user-0123456789"
LOAD, UNLOAD, CHAT = "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/chat/completions"


@dataclass
class LoraEngine(FakeEngine):
    """The fake engine with LoRA on: its adapters checked and kept as the real engine's are."""

    adapters: LoadedAdapters = field(
        default_factory=lambda: LoadedAdapters(FakeLoraLLM(), 16, BaseModel.of(set(), {}))
    )

    async def shutdown(self) -> None:
        await super().shutdown()
        await self.adapters.close()  # as the real engine's: the snapshots go


def adapter(tmp_path: Path, name: str = "ad1", rank: int = 8) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (folder / "adapter_model.bin").write_bytes(b"weights")
    return str(folder)


def client_for(engine: FakeEngine | None = None, **settings: object) -> TestClient:
    """Runtime loading on, from the temporary folder (the tests' `tmp_path`) unless said."""
    settings.setdefault("lora_roots", tempfile.gettempdir())
    return TestClient(fake_app(engine or LoraEngine(), allow_runtime_lora=True, **settings))


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.fixture
def engine() -> LoraEngine:
    return LoraEngine()


@pytest.fixture
def open_client(engine: LoraEngine) -> Iterator[TestClient]:
    with client_for(engine) as client:
        yield client


def test_a_loaded_adapter_is_a_model_until_it_is_unloaded(
    open_client: TestClient, engine: LoraEngine, tmp_path: Path
) -> None:
    path = adapter(tmp_path)
    loaded = open_client.post(LOAD, json={"lora_name": "ad1", "lora_path": path})
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'ad1' added successfully."
    cards = {c["id"]: c for c in open_client.get("/v1/models").json()["data"]}
    assert cards["ad1"]["parent"] == FAKE_MODEL and cards["ad1"]["root"] == path
    answer = open_client.post(CHAT, json=chat("ad1"))
    assert answer.status_code == 200 and answer.json()["model"] == "ad1"
    assert engine.asked_adapters[-1] == "ad1"
    # Cached apart from the base model: the same request to the base is generated anew.
    base = open_client.post(CHAT, json=chat(FAKE_MODEL))
    assert base.headers["x-cache"] == "MISS" and engine.asked_adapters[-1] is None
    again = open_client.post(CHAT, json=chat("ad1"))
    assert again.headers["x-cache"] == "HIT"
    unloaded = open_client.post(UNLOAD, json={"lora_name": "ad1"})
    assert unloaded.status_code == 200, unloaded.text
    for _ in range(2):  # the second time through the cache's fast path, had it remembered
        gone = open_client.post(CHAT, json=chat("ad1"))
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert "ad1" not in {c["id"] for c in open_client.get("/v1/models").json()["data"]}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"lora_name": "ad2", "lora_path": "NOWHERE"}, "no adapter folder at"),
        ({"lora_name": FAKE_MODEL, "lora_path": "PATH"}, "is already served"),
        ({"lora_name": "ad2", "lora_path": "RANK64"}, "rank 64 is over the engine's max_lora_rank"),
        ({"lora_name": "ad2"}, "lora_path"),
        ({"lora_name": "two words", "lora_path": "PATH"}, "lora_name"),
    ],
)
def test_an_adapter_that_cannot_be_loaded_is_a_400_saying_why(
    open_client: TestClient, tmp_path: Path, body: dict[str, str], says: str
) -> None:
    paths = {"PATH": adapter(tmp_path), "RANK64": adapter(tmp_path, "big", rank=64)}
    paths["NOWHERE"] = str(tmp_path / "nowhere")
    body = {k: paths.get(v, v) for k, v in body.items()}
    response = open_client.post(LOAD, json=body)
    assert response.status_code == 400, response.text
    assert says in json.dumps(response.json()["error"])


def test_an_adapter_already_loaded_is_a_400(open_client: TestClient, tmp_path: Path) -> None:
    body = {"lora_name": "ad1", "lora_path": adapter(tmp_path)}
    assert open_client.post(LOAD, json=body).status_code == 200
    again = open_client.post(LOAD, json=body)
    assert again.status_code == 400 and "already served" in again.json()["error"]["message"]


def test_unloading_what_is_not_loaded_is_a_404(open_client: TestClient) -> None:
    response = open_client.post(UNLOAD, json={"lora_name": "never"})
    assert response.status_code == 404
    base = open_client.post(UNLOAD, json={"lora_name": FAKE_MODEL})
    assert base.status_code == 404  # the base model is no adapter


def test_without_runtime_loading_the_routes_answer_404(tmp_path: Path) -> None:
    with TestClient(fake_app(LoraEngine())) as client:
        response = client.post(LOAD, json={"lora_name": "a", "lora_path": adapter(tmp_path)})
        assert response.status_code == 404
        assert "SLUICEGATE_ALLOW_RUNTIME_LORA" in response.json()["error"]["message"]


def test_with_api_keys_only_admin_keys_may_load(tmp_path: Path) -> None:
    body = {"lora_name": "ad1", "lora_path": adapter(tmp_path)}
    with client_for(api_keys=USER, admin_api_keys=ADMIN) as client:
        assert client.post(LOAD, json=body).status_code == 401
        refused = client.post(LOAD, json=body, headers=bearer(USER))
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert client.post(LOAD, json=body, headers=bearer(ADMIN)).status_code == 200
        # An admin key is an API key too; a user's key may use the adapter.
        assert client.post(CHAT, json=chat("ad1"), headers=bearer(ADMIN)).status_code == 200
        assert client.post(CHAT, json=chat("ad1"), headers=bearer(USER)).status_code == 200
        unload = {"lora_name": "ad1"}
        assert client.post(UNLOAD, json=unload, headers=bearer(USER)).status_code == 403
        assert client.post(UNLOAD, json=unload, headers=bearer(ADMIN)).status_code == 200


def test_with_api_keys_and_no_admin_keys_no_key_may_load(tmp_path: Path) -> None:
    body = {"lora_name": "ad1", "lora_path": adapter(tmp_path)}
    with client_for(api_keys=USER) as client:
        assert client.post(LOAD, json=body, headers=bearer(USER)).status_code == 403


def test_admin_keys_alone_guard_the_admin_routes_only(tmp_path: Path) -> None:
    body = {"lora_name": "ad1", "lora_path": adapter(tmp_path)}
    with client_for(admin_api_keys=ADMIN) as client:
        assert client.post(CHAT, json=chat(FAKE_MODEL)).status_code == 200
        assert client.post(LOAD, json=body).status_code == 401
        assert client.post(LOAD, json=body, headers=bearer("sk-wrong")).status_code == 401
        assert client.post(LOAD, json=body, headers=bearer(ADMIN)).status_code == 200


def test_the_admin_check_comes_before_the_body_is_read(tmp_path: Path) -> None:
    with client_for(api_keys=USER, admin_api_keys=ADMIN) as client:
        response = client.post(LOAD, content=b"{not json", headers=bearer(USER))
        assert response.status_code == 403


def test_a_path_outside_the_roots_is_a_400_even_through_a_symlink(tmp_path: Path) -> None:
    roots, outside = tmp_path / "roots", Path(adapter(tmp_path, "outside"))
    roots.mkdir()
    (roots / "link").symlink_to(outside)
    inside = adapter(roots, "inside")
    with client_for(lora_roots=f"{tmp_path / 'other'}, {roots}") as client:
        for path in (str(outside), str(roots / "link"), f"{roots}/../outside"):
            response = client.post(LOAD, json={"lora_name": "ad1", "lora_path": path})
            assert response.status_code == 400, path
            error = response.json()["error"]
            assert error["param"] == "lora_path" and "SLUICEGATE_LORA_ROOTS" in error["message"]
        loaded = client.post(LOAD, json={"lora_name": "ad1", "lora_path": inside})
        assert loaded.status_code == 200, loaded.text
        assert client.post(CHAT, json=chat("ad1")).status_code == 200


@pytest.mark.parametrize(
    "name", ["ad\x01", "ad\x7f", "\x1b[31mred", "ad\u202e", "ad\u200b", "tab\tbed", "a" * 257]
)
def test_an_adapter_name_with_control_characters_or_too_long_is_a_clear_400(
    open_client: TestClient, tmp_path: Path, name: str
) -> None:
    response = open_client.post(LOAD, json={"lora_name": name, "lora_path": adapter(tmp_path)})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "lora_name"
    assert "control characters" in error["message"] or "256 characters" in error["message"]
    assert name not in {c["id"] for c in open_client.get("/v1/models").json()["data"]}


def test_a_path_with_control_characters_is_a_400(open_client: TestClient) -> None:
    response = open_client.post(LOAD, json={"lora_name": "ad1", "lora_path": "/a\n/b"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "lora_path"


def test_an_adapter_and_an_alias_share_their_models_rate_limit(tmp_path: Path) -> None:
    """An adapter or an alias is the same model's capacity: not a fresh limit each."""
    listed = f"""
    models:
      - name: {FAKE_MODEL}
        engine: local
        aliases: [short]
        rate_limit: {{requests_per_minute: 1}}
    """
    with client_for(models_file=models_file(tmp_path, listed), cache_policy="off") as client:
        body = {"lora_name": "ad1", "lora_path": adapter(tmp_path)}
        assert client.post(LOAD, json=body).status_code == 200
        assert client.post(CHAT, json=chat(FAKE_MODEL)).status_code == 200
        for name in ("ad1", "short"):
            refused = client.post(CHAT, json=chat(name))
            assert refused.status_code == 429, name
            assert f"on the model {FAKE_MODEL}" in refused.json()["error"]["message"]
