"""schemathesis against the app's own OpenAPI spec, valid and invalid cases, over real HTTP.

The property: whatever arrives, the answer is never a 5xx, every error is OpenAI's error
body (Anthropic's on the Messages API's paths), nothing hangs, and the server stays
healthy. One test per operation and generation mode, so parallel test processes share the
work; over 5,000 cases in all.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from sluicegate.paths import ANTHROPIC_PATHS
from tests.support.fakes import FakeEngine, fake_app

SCHEMA = schemathesis.openapi.from_dict(fake_app(FakeEngine()).openapi())
OPERATIONS = {
    f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in SCHEMA.get_all_operations())
}
MODES = {"valid": GenerationMode.POSITIVE, "invalid": GenerationMode.NEGATIVE}
TAKE_BODIES = {label for label, op in OPERATIONS.items() if "requestBody" in op.definition.raw}
"""The operations with a request body (a POST may have none: `/admin/keys/restore`)."""


# Routes whose bodies are two names: a tenth of the examples covers their input space.
SMALL_BODIES = {"POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter"}
LARGE_SCHEMAS = {
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /tokenize",
}
"""Routes whose body schemas are the largest (messages of every role and content part, tools,
reasoning, structured outputs): each example takes hypothesis 0.1 s or more to draw, about
ten times a small body's, so 550 of them in both modes made this module most of the unit
tier's time. 300 each, still the most cases of any route."""


def examples(label: str) -> int:
    if label in SMALL_BODIES:
        return 60
    if label in LARGE_SCHEMAS:
        return 300
    return 550 if label in TAKE_BODIES and label.startswith("POST") else 30


def test_every_operation_that_takes_a_body_is_fuzzed() -> None:
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses"} <= set(
        OPERATIONS
    )


# Each case has its own 10 s limit: a hang fails it at once.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("label", list(OPERATIONS))
def test_no_generated_input_gets_a_5xx_or_a_malformed_error(
    fake_gateway: str, label: str, mode: str
) -> None:
    seen: list[int] = []

    @settings(
        max_examples=examples(label),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=OPERATIONS[label].as_strategy(generation_mode=MODES[mode]))
    def check(case: schemathesis.Case) -> None:
        response = case.call(base_url=fake_gateway, timeout=10)
        seen.append(response.status_code)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400:
            body = response.json()
            error = body["error"]
            if case.path in ANTHROPIC_PATHS:
                assert body["type"] == "error" and set(error) == {"type", "message"}
            else:
                assert set(error) == {"message", "type", "param", "code"}
            assert isinstance(error["message"], str) and error["message"]

    try:
        check()
    except Unsatisfiable:
        # No invalid input exists: no body, and parameters that take any string
        # (`GET /v1/models/{model}`, `DELETE /v1/responses/{response_id}`).
        assert mode == "invalid" and label not in TAKE_BODIES, label
        return
    print(f"schemathesis {label} {mode}: {len(seen)} cases, statuses {sorted(set(seen))}")
    assert seen, "no case ran"
    if label in TAKE_BODIES:
        # Bodies are where the input space is: most of the examples asked for must run,
        # and invalid bodies must be refused with a 4xx, not accepted.
        assert len(seen) >= examples(label) // 2, f"only {len(seen)} cases ran"
        if mode == "invalid":
            assert any(400 <= code < 500 for code in seen), sorted(set(seen))
    assert httpx.get(f"{fake_gateway}/health").status_code == 200
    assert httpx.get(f"{fake_gateway}/ready").status_code == 200
