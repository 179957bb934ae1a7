"""The capture's order, bounds and thread, driven through `TrafficCapture` with requests made
by hand (no app): each test writes to memory and reads the lines once the capture closed."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluicegate.observability.capture import TrafficCapture
from sluicegate.observability.prefix_blocks import PrefixBlocks
from sluicegate.observability.record import RequestRecord
from tests.support.metrics import local_value

CHAT = "/v1/chat/completions"


@dataclass
class Prompt:
    ids: list[int]
    images: tuple[object, ...] = ()
    image_tokens: int = 0

    @property
    def length(self) -> int:
        return len(self.ids) + self.image_tokens


@dataclass
class Options:
    max_tokens: int = 8
    n: int = 1


@dataclass
class Run:
    prompts: list[Prompt]
    options: Options = field(default_factory=Options)
    priority: int = 0
    counted: dict[int, int] = field(default_factory=dict)


class Memory(io.BytesIO):
    """Keeps what was written once closed."""

    def close(self) -> None:
        self.kept = self.getvalue()
        super().close()


def open_capture(**writer: Any) -> tuple[TrafficCapture, Memory]:
    file = Memory()
    # The thread drains when the capture closes: what it writes does not depend on timing.
    writer = {"interval": 60.0, **writer}
    capture = TrafficCapture.open(file, sample=1.0, max_bytes=1 << 20, max_model_len=64, **writer)
    return capture, file


def arrive(capture: TrafficCapture, ids: Sequence[int] = (), **run: Any) -> RequestRecord:
    record = RequestRecord()
    capture.arrived(record, CHAT)
    assert record.traffic is not None
    prompts = run.pop("prompts", None) or [Prompt(list(ids))]
    record.traffic.shape(Run(prompts, **run), stream=False)  # type: ignore[arg-type]
    record.traffic.runs("MISS")
    return record


def end(capture: TrafficCapture, record: RequestRecord, tokens: int = 1) -> None:
    assert record.traffic is not None
    record.traffic.add(0, 0, tokens, "stop")
    capture.ended(record)


def lines(capture: TrafficCapture, file: Memory) -> list[dict[str, Any]]:
    asyncio.run(capture.close())
    return [json.loads(line) for line in file.kept.splitlines()[1:]]


def test_requests_leave_in_arrival_order() -> None:
    capture, file = open_capture()
    first, second = arrive(capture, range(5)), arrive(capture, range(7))
    end(capture, second)
    end(capture, first)
    assert [line["input_tokens"] for line in lines(capture, file)] == [5, 7]


def test_one_open_too_long_is_given_up_and_dropped_when_it_ends() -> None:
    dropped = local_value("sluicegate_traffic_capture_lines_total", outcome="dropped")
    capture, file = open_capture(max_held=1)
    stuck = arrive(capture, range(3))
    for length in (4, 5, 6):
        end(capture, arrive(capture, range(length)))
    end(capture, stuck)
    assert [line["input_tokens"] for line in lines(capture, file)] == [4, 5, 6]
    assert local_value("sluicegate_traffic_capture_lines_total", outcome="dropped") == dropped + 1


def test_prompts_are_hashed_on_the_writers_thread_and_the_key_forgotten_at_close() -> None:
    threads: list[str] = []

    class Watched(PrefixBlocks):
        def digests(self, ids: Sequence[int]) -> list[bytes]:
            threads.append(threading.current_thread().name)
            return super().digests(ids)

    capture, file = open_capture(blocks=Watched())
    end(capture, arrive(capture, range(40)))
    assert capture.keyed
    (line,) = lines(capture, file)
    assert threads == ["traffic-capture"]
    assert line["blocks"] == [1, 2]
    assert not capture.keyed


def test_the_engines_own_count_stands_for_a_prompt_not_counted_here() -> None:
    dropped = local_value("sluicegate_traffic_capture_lines_total", outcome="dropped")
    capture, file = open_capture()
    end(capture, arrive(capture, [], counted={0: 12}))
    end(capture, arrive(capture, []))  # nobody counted it: no line can say its length
    (line,) = lines(capture, file)
    assert (line["input_tokens"], line["blocks"]) == (12, [])
    assert local_value("sluicegate_traffic_capture_lines_total", outcome="dropped") == dropped + 1


def test_a_prompt_with_images_has_no_blocks() -> None:
    capture, file = open_capture()
    prompt = Prompt(list(range(40)), images=(object(),), image_tokens=10)
    end(capture, arrive(capture, prompts=[prompt]))
    (line,) = lines(capture, file)
    assert (line["input_tokens"], line["blocks"]) == (50, [])


@pytest.mark.parametrize(
    ("max_tokens", "tokens", "expected"),
    [(8, 3, 8), (500, 3, 24), (2, 5, 5)],
)
def test_max_tokens_fits_the_window_and_covers_the_output(
    max_tokens: int, tokens: int, expected: int
) -> None:
    capture, file = open_capture()  # a window of 64
    end(capture, arrive(capture, range(40), options=Options(max_tokens)), tokens)
    (line,) = lines(capture, file)
    assert line["max_tokens"] == expected


def test_arrivals_past_what_the_writer_holds_are_not_captured() -> None:
    dropped = local_value("sluicegate_traffic_capture_lines_total", outcome="dropped")
    capture, file = open_capture(max_pending=1)
    first, second = arrive(capture, range(3)), arrive(capture, range(4))
    assert second.traffic is not None and not second.traffic.kept
    end(capture, first)
    end(capture, second)
    assert [line["input_tokens"] for line in lines(capture, file)] == [3]
    assert local_value("sluicegate_traffic_capture_lines_total", outcome="dropped") == dropped + 1


def test_a_request_that_ran_no_engine_is_no_line() -> None:
    capture, file = open_capture()
    record = RequestRecord()
    capture.arrived(record, CHAT)  # a cache hit: never shaped, never run
    capture.ended(record)
    other = RequestRecord()
    capture.arrived(other, "/v1/embeddings")
    assert other.traffic is None
    end(capture, arrive(capture, range(3)))
    assert [line["input_tokens"] for line in lines(capture, file)] == [3]


def test_what_a_shared_run_produces_after_its_request_ended_is_not_its_own() -> None:
    capture, file = open_capture()
    record = arrive(capture, range(3))
    end(capture, record, tokens=2)
    assert record.traffic is not None
    record.traffic.add(0, 0, 5, "length")  # the leader's run goes on for its followers
    (line,) = lines(capture, file)
    assert (line["output_tokens"], line["finish_reason"]) == (2, "stop")
