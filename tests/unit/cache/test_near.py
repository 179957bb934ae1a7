"""The near cache alone: its gates, the race between a read and a change, TTL, and its
bound in bytes measured against the memory its entries really hold."""

from __future__ import annotations

import gc
import os
import tracemalloc

from sluicegate.cache.near import NearCache, NearEntry
from sluicegate.wire.body_template import BodyTemplate
from sluicegate.wire.completion import ChoiceState, Collector, Completion
from sluicegate.wire.formats import chat_format
from tests.support.clock import Clock
from tests.support.fakes import fake_completion
from tests.support.memory import traced_alone


def kept(near: NearCache, key: str, clock: Clock, ttl: float = 60.0) -> NearEntry:
    token = near.begin_fill(key)
    return near.fill(key, token, fake_completion(), 0.0, clock.now + ttl)


def connected(max_bytes: int = 1 << 20, fresh_for: float = 1.0) -> tuple[NearCache, Clock]:
    clock = Clock()
    near = NearCache(max_bytes, 1 << 20, clock=clock)
    near.connect(fresh_until=clock.now + fresh_for)
    return near, clock


def test_an_entry_read_is_served_until_its_ttl_runs_out() -> None:
    near, clock = connected(fresh_for=100)
    entry = kept(near, "k", clock, ttl=5)
    assert near.get("k") is entry
    clock.now += 5
    assert near.get("k") is None and len(near) == 0


def test_a_change_reported_during_the_read_keeps_its_result_out() -> None:
    near, clock = connected()
    token = near.begin_fill("k")
    near.invalidate(["k"])  # the key changed while its old value was on the way
    entry = near.fill("k", token, fake_completion(), 0.0, clock.now + 60)
    assert entry.completion.choices[0].text  # this request may use what it read
    assert near.get("k") is None and len(near) == 0


def test_a_flush_during_the_read_keeps_its_result_out() -> None:
    near, clock = connected()
    token = near.begin_fill("k")
    near.flush()
    near.fill("k", token, fake_completion(), 0.0, clock.now + 60)
    assert near.get("k") is None


def test_a_reported_change_drops_the_entry() -> None:
    near, clock = connected()
    kept(near, "a", clock)
    kept(near, "b", clock)
    near.invalidate(["a", "unknown"])
    assert near.get("a") is None and near.get("b") is not None


def test_nothing_is_kept_or_served_while_disconnected() -> None:
    near, clock = connected()
    kept(near, "k", clock)
    near.disconnect()
    assert len(near) == 0 and near.size_bytes == 0
    assert near.begin_fill("k") is None
    near.fill("k", None, fake_completion(), 0.0, clock.now + 60)
    assert len(near) == 0


def test_nothing_is_served_once_the_last_heartbeat_is_too_old_until_the_next() -> None:
    near, clock = connected(fresh_for=1.0)
    entry = kept(near, "k", clock)
    clock.now += 1.0
    assert near.get("k") is None  # silent too long: whatever changed may be unreported
    near.fresh_until = clock.now + 1.0  # an answer: every change before it was reported
    assert near.get("k") is entry


def test_off_when_sized_zero() -> None:
    near = NearCache(0, 1 << 20)
    near.connect()
    assert not near.connected and near.begin_fill("k") is None


def test_bounded_in_bytes_least_recently_used_going_first() -> None:
    near, clock = connected(max_bytes=64 * 1024, fresh_for=100)
    for i in range(1000):
        kept(near, f"key-{i}", clock)
        assert near.size_bytes <= 64 * 1024
    assert 0 < len(near) < 1000
    assert near.get("key-999") is not None and near.get("key-0") is None


def test_a_body_kept_with_its_entry_counts_toward_the_bound() -> None:
    near, clock = connected(fresh_for=100)
    entry = kept(near, "k", clock)
    before = near.size_bytes
    _, body = BodyTemplate.of(chat_format("m", False), entry.completion, True, False)
    assert body is not None
    near.add_body("k", entry, "stream", body)
    assert entry.bodies["stream"] is body
    assert near.size_bytes == before + body.size
    near.invalidate(["k"])
    near.add_body("k", entry, "json", body)  # gone: nothing to add to
    assert near.size_bytes == 0


def test_the_size_counted_is_at_least_the_memory_held() -> None:
    """Decoded entries of several shapes (short and long text, many choices, logprobs with
    alternatives) and their rendered bodies: the bound is never below what they hold."""
    shapes = [
        fake_completion("Hi"),
        fake_completion(" ".join(["word"] * 200)),
        fake_completion("naïve café " * 20, choices=4),
        fake_completion(" ".join(["tok"] * 50), logprobs=5),
    ]
    for completion in shapes:
        near, clock = connected(max_bytes=1 << 30, fresh_for=100)
        gc.collect()
        with traced_alone():
            held = memory_held_by_entries(near, clock, completion)
        assert len(near) == 20
        assert near.size_bytes >= held, (near.size_bytes, held)


def memory_held_by_entries(near: NearCache, clock: Clock, completion: Completion) -> int:
    """Bytes still allocated once 20 entries like `completion`, each a copy of its own as a
    decoded entry would be, and their rendered bodies are kept in `near`."""
    baseline = tracemalloc.get_traced_memory()[0]
    for i in range(20):
        copy = Collector(range(len(completion.choices)))
        for delta in completion.deltas():
            copy.add(delta)
        key = f"sluicegate:cache:v1:m:{i:064x}"
        token = near.begin_fill(key)
        entry = near.fill(key, token, copy.completion(3), 0.0, clock.now + 60)
        _, body = BodyTemplate.of(chat_format("m", True), entry.completion, True, True)
        assert body is not None
        near.add_body(key, entry, "stream", body)
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - baseline


def test_memory_stays_within_the_bound_over_100_000_distinct_keys() -> None:
    """100,000 distinct entries (every tenth with a rendered body) through a 4 MiB near
    cache: the count never passes the bound, and the process grows by about that much, not
    by the 150 MB the entries would take unbounded (the test above checks that the count is
    at least the memory held)."""
    bound = 4 << 20
    near, clock = connected(max_bytes=bound, fresh_for=100)
    fmt = chat_format("m", False)
    gc.collect()
    before = resident_bytes()
    for i in range(100_000):
        key = f"sluicegate:cache:v1:m:{i:064x}"
        completion = Completion([ChoiceState(0, [f"Answer number {i}", "."], None, None, 2)], 9)
        token = near.begin_fill(key)
        entry = near.fill(key, token, completion, 0.0, clock.now + 60)
        if i % 10 == 0:
            _, body = BodyTemplate.of(fmt, completion, False, False)
            assert body is not None
            near.add_body(key, entry, "json", body)
        assert near.size_bytes <= bound
    gc.collect()
    grown = resident_bytes() - before
    assert 1000 < len(near) < 100_000
    assert grown <= 2 * bound, grown


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
