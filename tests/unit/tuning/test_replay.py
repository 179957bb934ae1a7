"""A profile's requests replayed against a gateway (the fake engine's, over loopback): sent on
their own times, prompts of the profile's lengths that share blocks where it did, and each
outcome measured: first token, gaps, tokens; refusals and failures told apart."""

from __future__ import annotations

from sluicegate.errors import OverloadedError
from sluicegate.tuning.profile import Request
from sluicegate.tuning.prompts import PromptMaker
from sluicegate.tuning.replay import Target, replay
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread


def request(t: float, blocks: tuple[int, ...] = (1, 2), tokens: int = 40) -> Request:
    return Request(t, tokens, 3, 3, True, "chat", 0, "MISS", "stop", blocks)


def test_prompts_share_blocks_where_the_profile_did_and_a_new_salt_changes_them() -> None:
    maker = PromptMaker(range(2, 1000), block_size=16, salt=1)
    a = maker.ids(request(0, (1, 2, 3)), 0)
    b = maker.ids(request(0, (1, 2, 4)), 1)
    assert len(a) == len(b) == 40 and a[:32] == b[:32] and a[32:] != b[32:]
    assert maker.ids(request(0, ()), 2) != maker.ids(request(0, ()), 3)
    assert PromptMaker(range(2, 1000), 16, salt=2).ids(request(0, (1, 2, 3)), 0) != a


async def test_each_request_is_sent_on_time_and_measured() -> None:
    engine = FakeEngine(step_delay=1.0)  # each answer takes 3 s
    with serve_in_thread(fake_app(engine)) as url:
        target = Target(url, FAKE_MODEL)
        outcomes = await replay(
            target, [request(0.0), request(0.3), request(0.6)], PromptMaker(range(2, 1000), 16)
        )
    assert len(engine.prompts) == 3 and [len(p.ids) for p in engine.prompts] == [40, 40, 40]
    assert engine.prompts[0].ids[:32] == engine.prompts[1].ids[:32]
    # On their own times (not before), and open loop: the last went before the first
    # answer ended (its first token and gaps, as the client saw them), not after it.
    answered_in = outcomes[0].ttft + sum(outcomes[0].gaps)  # type: ignore[operator]
    assert 0.55 <= engine.arrivals[2] - engine.arrivals[0] < answered_in
    for outcome in outcomes:
        assert outcome.ttft is not None and len(outcome.gaps) == 2 and outcome.tokens == 3
        assert not outcome.refused and not outcome.failed


async def test_refusals_and_failures_are_told_apart() -> None:
    """A 503 before the answer is a refusal; an error after its first token a failure."""
    for engine, refused in (
        (FakeEngine(fail_before_output=OverloadedError()), True),
        (FakeEngine(fail_after_words=1), False),
    ):
        with serve_in_thread(fake_app(engine)) as url:
            (outcome,) = await replay(
                Target(url, FAKE_MODEL), [request(0.0)], PromptMaker(range(2, 1000), 16)
            )
        assert (outcome.refused, outcome.failed) == (refused, not refused)
        assert (outcome.ttft is None) == refused


async def test_a_stream_still_answering_at_the_replays_end_is_cut_not_failed() -> None:
    """Cut at the window's end: judged on what it showed (its first token and gaps so far),
    not failed; past the target's own timeout instead, it failed."""
    # A fourth word only after 5 s.
    engine = FakeEngine(words=["a", " b", " c", " d"], delays=[0.0, 0.1, 0.1, 5.0])
    long = [Request(0.0, 40, 10, 10, True, "chat", 0, "MISS", "length", (1, 2))]
    with serve_in_thread(fake_app(engine)) as url:
        prompts = PromptMaker(range(2, 1000), 16)
        (cut,) = await replay(Target(url, FAKE_MODEL, cut_at=1.5), long, prompts)
        (failed,) = await replay(Target(url, FAKE_MODEL, timeout=1.5), long, prompts)
    assert cut.cut and not cut.failed and cut.ttft is not None
    # Its two gaps, and the one it was in when cut (1.5 s less the first three words'
    # 0.2 s: at least a second), which is what a stalled stream is judged by.
    assert len(cut.gaps) == 3 and cut.gaps[-1] > 1.0 and cut.tokens == 3
    assert failed.failed and not failed.cut
