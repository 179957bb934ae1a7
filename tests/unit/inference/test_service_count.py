"""`count_chat` (Anthropic's `count_tokens`) with the bundled model's real tokenizer: the count
is the prompt the run of the same request gets, not a count of its parts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluicegate.engine.tokenizer import HFPromptTokenizer
from sluicegate.inference.service import CompletionService
from sluicegate.wire.requests import ChatCompletionRequest
from sluicegate.wire.tools import ToolLimits
from tests.support.fakes import FAKE_MODEL, FakeEngine

TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "enum": ["main.py", "util.py"]}},
            "required": ["path"],
        },
    },
}
CHATS: list[dict[str, Any]] = [
    {
        "messages": [
            {
                "role": "system",
                "content": "You are a coding agent. Read files with the read_file tool.",
            },
            {"role": "user", "content": "Read main.py"},
        ],
        "tools": [TOOL],
    },
    {"messages": [{"role": "user", "content": "hi"}]},
    {
        "messages": [
            {"role": "user", "content": "Tell me, in detail:\n\n- why\n- how"},
            {"role": "assistant", "content": "Because.\n\n"},
            {"role": "user", "content": "  And then?  "},
        ]
    },
]


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[HFPromptTokenizer]:
    """The bundled model's tokenizer with the shipped template, which renders tools."""
    from transformers import AutoTokenizer

    from sluicegate.engine.model import bundled_model_dir, shipped_template
    from sluicegate.settings import Settings

    folder = bundled_model_dir(Settings().model_cache_dir)
    made = HFPromptTokenizer(
        AutoTokenizer.from_pretrained(folder), chat_template=shipped_template()
    )
    yield made
    made.close()


async def test_the_count_is_the_runs_prompt(tokenizer: HFPromptTokenizer) -> None:
    hf_tokenizer = tokenizer
    engine = FakeEngine(max_model_len=2048, tokenizer=hf_tokenizer)  # type: ignore[arg-type]
    service = CompletionService(engine, FAKE_MODEL)
    by_parts, counts = [], []
    for chat in CHATS:
        request = ChatCompletionRequest.model_validate({"model": FAKE_MODEL, **chat})
        # Before anything: the tokenizer remembers exact encodings, never counts by parts.
        counted = await hf_tokenizer.encode_chat_counted(
            request.prompt_messages(), ids_up_to=0, tools=request.tool_setup(ToolLimits()).tools
        )
        by_parts.append(counted.length)
        counts.append(await service.count_chat(request))
        run = await service.prepare_chat(request)
        assert counts[-1] == run.prompt_tokens == len(run.prompts[0].ids)
    # The control: a count by parts is off for one of them (the first, by one token).
    assert by_parts != counts
