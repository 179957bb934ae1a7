"""A stream silent for longer than a proxy's idle timeout comes whole through that proxy: the
gateway's keep-alives (`STREAM_KEEPALIVE_INTERVAL`) keep the connection busy, mid-stream and
before the first token, on chat (the openai SDK, thoughts left out), Responses (the openai SDK)
and Messages (the anthropic SDK). Control: a gateway whose interval is above the proxy's idle
time has the same stream cut.

The upstream is `tests.support.fault_upstream`: it thinks (`reasoning`), then says nothing for
`SILENCE` seconds (`stall` after the thoughts), or says nothing before its headers (`stall`).
Two upstream-only gateways serve it, each behind a `tests.support.idle_proxy` that closes a
connection quiet for `IDLE` seconds, as nginx's `proxy_read_timeout` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.fault_upstream import FaultUpstreamProcess
from tests.support.fault_upstream import running as running_upstream
from tests.support.gateway import GatewayProcess, GatewaySpec, running_gateways
from tests.support.idle_proxy import IdleProxy, running_idle_proxy

IDLE, INTERVAL, SILENCE = 3.0, 0.5, 6.0
"""The proxy's idle time is six keep-alive intervals, and the silence twice the idle time: a
gateway starved for seconds by a loaded machine still keeps its streams alive, and a finished
stream's client closing its connection late is not taken for a cut."""
WORDS = "Water finds the open"
"""The fault upstream's first four words (`--chunks 4`)."""
THOUGHTS = ["Quietly", " thinking."]
MID_STREAM = {"reasoning": THOUGHTS, "stall": SILENCE, "after_chunks": 1 + len(THOUGHTS)}
"""The role chunk and the thoughts, then silence, then the words."""
BEFORE_FIRST = {"reasoning": THOUGHTS, "stall": SILENCE}
"""Silence before the upstream's headers."""
SILENCES = {"mid-stream": MID_STREAM, "before the first token": BEFORE_FIRST}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultUpstreamProcess]:
    log = tmp_path_factory.mktemp("silent") / "upstream.log"
    with running_upstream(log, "--chunks", "4") as process:
        yield process


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstreamProcess
) -> Iterator[dict[str, GatewayProcess]]:
    """Two gateways over the upstream: keep-alives every `INTERVAL`, and every 30 s (far above
    the proxy's idle time and the silence: the control)."""
    folder = tmp_path_factory.mktemp("gateways")
    models = folder / "models.yaml"
    models.write_text(f'models:\n  - name: silent\n    upstreams: [{{url: "{upstream.url}"}}]\n')
    env = {
        "SLUICEGATE_MODELS_FILE": str(models),
        "SLUICEGATE_CACHE_POLICY": "off",
        "SLUICEGATE_UPSTREAM_MAX_RETRIES": "0",
    }
    kept = GatewaySpec(env={**env, "SLUICEGATE_STREAM_KEEPALIVE_INTERVAL": str(INTERVAL)})
    late = GatewaySpec(env={**env, "SLUICEGATE_STREAM_KEEPALIVE_INTERVAL": "30"})
    with running_gateways(folder, kept, late) as (alive, control):
        yield {"alive": alive, "control": control}


@pytest.fixture
def proxy(gateways: dict[str, GatewayProcess]) -> Iterator[IdleProxy]:
    with running_idle_proxy(gateways["alive"].url, idle=IDLE) as proxy:
        yield proxy


def chat(base: str) -> tuple[str, str | None]:
    text, finish = "", None
    with openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=30) as sdk:
        chunks = sdk.chat.completions.create(
            model="silent",
            messages=[{"role": "user", "content": "Think, then answer."}],
            stream=True,
            extra_body={"include_reasoning": False},
        )
        for chunk in chunks:
            for choice in chunk.choices:
                shown = (choice.delta.model_extra or {}).get("reasoning")
                assert not shown, "a thought was shown"
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
    return text, finish


def responses(base: str) -> tuple[str, str | None]:
    with (
        openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=30) as sdk,
        sdk.responses.stream(model="silent", input="Think, then answer.") as events,
    ):
        for _ in events:
            pass
        final = events.get_final_response()
    return final.output_text, final.status


def messages(base: str) -> tuple[str, str | None]:
    request: dict[str, Any] = {
        "model": "silent",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Think, then answer."}],
    }
    with (
        anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=30) as sdk,
        sdk.messages.stream(**request) as events,
    ):
        for _ in events:
            pass
        final = events.get_final_message()
    text = "".join(block.text for block in final.content if block.type == "text")
    return text, final.stop_reason


READERS = {"chat": chat, "responses": responses, "messages": messages}
ENDS = {"chat": "stop", "responses": "completed", "messages": "end_turn"}


Answer = tuple[str, str | None]
"""A stream's text and how it ended (finish reason, status, stop reason)."""


def timed(read: Callable[[str], Answer], base: str) -> tuple[str, str | None, float]:
    started = time.monotonic()
    text, end = read(base)
    return text, end, time.monotonic() - started


@pytest.mark.parametrize("how", list(SILENCES))
def test_a_silent_stream_comes_whole_through_a_proxy_that_cuts_idle_connections(
    how: str, upstream: FaultUpstreamProcess, proxy: IdleProxy
) -> None:
    # The three APIs at once (a silence each), so the module stays short.
    upstream.control(**SILENCES[how], times=len(READERS))
    with ThreadPoolExecutor(len(READERS)) as pool:
        running = {api: pool.submit(timed, read, proxy.url) for api, read in READERS.items()}
        got = {api: future.result() for api, future in running.items()}
    assert {api: (text, end) for api, (text, end, _) in got.items()} == {
        api: (WORDS, ENDS[api]) for api in READERS
    }
    # Each was silent for twice the proxy's idle time, which cut nothing.
    assert all(took >= SILENCE for _, _, took in got.values()), got
    assert proxy.cuts == 0


def test_with_the_interval_above_the_proxys_idle_time_the_proxy_cuts_the_stream(
    upstream: FaultUpstreamProcess, gateways: dict[str, GatewayProcess]
) -> None:
    upstream.control(**MID_STREAM, times=1)
    with running_idle_proxy(gateways["control"].url, idle=IDLE) as proxy:
        with pytest.raises((httpx.HTTPError, openai.APIError)):
            chat(proxy.url)
        assert proxy.cuts == 1
