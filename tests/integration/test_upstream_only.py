"""Upstream mode on an install without the engine: no vLLM, no torch, no model prepared.

The gateway is a real `python -m sluicegate serve` whose `sitecustomize` (first on its
PYTHONPATH) makes the blocked packages look not installed: `import torch` raises
ModuleNotFoundError, and `importlib.util.find_spec("torch")` answers None, as it does where
the package is missing. At exit it writes down every package of a watched list that the
process had loaded. Its environment has no `HF_HUB_OFFLINE`, and `HF_ENDPOINT` is a loopback
port: a closed one, or a fake Hugging Face hub serving a tokenizer. The upstream is
`tests.support.fault_upstream`; each gateway is up in seconds.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import fault_upstream
from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.gateway import GatewayProcess, start_gateway

ENGINE_PACKAGES = ("vllm", "torch")
WATCHED = (*ENGINE_PACKAGES, "transformers", "tokenizers", "huggingface_hub", "jinja2", "numpy")

SITECUSTOMIZE = """
import atexit, json, os, sys

for name in os.environ["TEST_BLOCKED_IMPORTS"].split(","):
    sys.modules[name] = None  # what the import system reads as "not installed"


@atexit.register
def _report() -> None:
    watched = set(os.environ["TEST_WATCHED_IMPORTS"].split(","))
    loaded = {n.partition(".")[0] for n, m in list(sys.modules.items()) if m is not None}
    with open(os.environ["TEST_IMPORTS_REPORT"], "w") as report:
        json.dump(sorted(loaded & watched), report)
"""

# A tokenizer folder of a few words, with a chat template: what `SLUICEGATE_TOKENIZER` names.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
WORDS = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "say", "something."]
SAY_SOMETHING = [WORDS.index("say"), WORDS.index("something.")]
CHAT = {
    "model": "fault-model",
    "messages": [{"role": "user", "content": "Say something."}],
    "max_tokens": 8,
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("fault") / "upstream.log"
    process = fault_upstream.start(0, log=log)
    try:
        yield process
    finally:
        process.stop()


def _gateway(
    tmp_path: Path,
    upstream: FaultUpstreamProcess,
    blocked: tuple[str, ...],
    hub: str = "http://127.0.0.1:9",
    **settings: str,
) -> GatewayProcess:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        # Not offline (the helper's default): a tokenizer may come from the hub at HF_ENDPOINT.
        "HF_HUB_OFFLINE": "",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "TEST_BLOCKED_IMPORTS": ",".join(blocked),
        "TEST_WATCHED_IMPORTS": ",".join(WATCHED),
        "TEST_IMPORTS_REPORT": str(tmp_path / "imports.json"),
        "HF_ENDPOINT": hub,
        "HF_HOME": str(tmp_path / "hf"),
        "SLUICEGATE_UPSTREAM_URLS": upstream.url,
        "SLUICEGATE_MODEL_CACHE_DIR": str(tmp_path / "models"),
        "SLUICEGATE_CACHE_POLICY": "off",
        **{f"SLUICEGATE_{k.upper()}": v for k, v in settings.items()},
    }
    return start_gateway(tmp_path, env=env)


def _loaded(tmp_path: Path, gateway: GatewayProcess) -> list[str]:
    """The watched packages the gateway had loaded, once it has exited (cleanly)."""
    assert gateway.stop() == 0, gateway.log()[-3000:]
    loaded: list[str] = json.loads((tmp_path / "imports.json").read_text())
    return loaded


def _tokenizer_folder(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir()
    vocab = {word: i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


class FakeHub(http.server.ThreadingHTTPServer):
    """The part of the Hugging Face hub that `from_pretrained` reads: a repository's files at
    `/{repo}/resolve/{revision}/{file}` (HEAD and GET), 404 for everything else."""

    def __init__(self, repo: str, folder: Path) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.repo = repo
        self.files = {p.name: p.read_bytes() for p in folder.iterdir()}
        self.fetched: collections.Counter[str] = collections.Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(http.server.BaseHTTPRequestHandler):
    server: FakeHub

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        prefix = f"/{self.server.repo}/resolve/main/"
        name = self.path.removeprefix(prefix) if self.path.startswith(prefix) else None
        data = self.server.files.get(name) if name else None
        self.send_response(404 if data is None else 200)
        self.send_header("X-Repo-Commit", "0" * 40)
        if data is None:
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.server.fetched[str(name)] += 1
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    server = FakeHub("sluicegate-test/tiny-tokenizer", _tokenizer_folder(tmp_path / "repo"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _tokenize(gateway: GatewayProcess) -> list[int]:
    """`/tokenize` of two words of the tokenizer's vocabulary (as ids)."""
    body = {"model": "fault-model", "prompt": "say something."}
    reply = httpx.post(gateway.url + "/tokenize", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    tokens: list[int] = reply.json()["tokens"]
    return tokens


def test_upstream_mode_serves_without_vllm_torch_or_transformers(
    tmp_path: Path, upstream: FaultUpstreamProcess
) -> None:
    gateway = _gateway(tmp_path, upstream, (*ENGINE_PACKAGES, "transformers"))
    try:
        assert httpx.get(gateway.url + "/ready", timeout=10).status_code == 200
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        streamed = httpx.post(
            gateway.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30
        )
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    finally:
        loaded = _loaded(tmp_path, gateway)
    assert loaded == []
    # No bundled model was prepared: the model cache was not even created.
    assert not (tmp_path / "models").exists()


def test_a_local_tokenizer_loads_with_transformers_alone(
    tmp_path: Path, upstream: FaultUpstreamProcess
) -> None:
    folder = _tokenizer_folder(tmp_path / "tokenizer")
    gateway = _gateway(tmp_path, upstream, ENGINE_PACKAGES, tokenizer=str(folder))
    try:
        # The budget counts with it: /tokenize answers from the folder's vocabulary.
        assert _tokenize(gateway) == SAY_SOMETHING
        chat = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert chat.status_code == 200, chat.text
    finally:
        loaded = _loaded(tmp_path, gateway)
    assert "transformers" in loaded
    assert not set(loaded) & set(ENGINE_PACKAGES)
    assert not (tmp_path / "models").exists()


def test_a_hub_tokenizer_id_is_fetched_from_a_reachable_hub(
    tmp_path: Path, upstream: FaultUpstreamProcess, hub: FakeHub
) -> None:
    gateway = _gateway(tmp_path, upstream, ENGINE_PACKAGES, hub=hub.url, tokenizer=hub.repo)
    try:
        assert _tokenize(gateway) == SAY_SOMETHING
    finally:
        loaded = _loaded(tmp_path, gateway)
    assert hub.fetched["tokenizer.json"] == 1
    assert not set(loaded) & set(ENGINE_PACKAGES)
