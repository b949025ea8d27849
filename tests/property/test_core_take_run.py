"""The DRR lane's shortcut (``Lane._take_run``) picks exactly what picking one by one picks.

Every trace is played twice on the same configuration: as shipped, and with
the shortcut off (the base class's, which takes nothing more). Both must
give the same batches, in the same order, and the same expiries, call by
call, and leave the lane's rings in the same state after each call (each
org's deficit and turn, the tiers' credit and turns granted: a turn granted
early changes a later choice only rarely); and on a backlog the shortcut
must have taken something, or this test compares the one-by-one path with
itself.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import given

from scheduler import Entry, Scheduler
from scheduler.lane import Lane, _LaneBase
from tests.core_setup import ENDPOINT, config_for
from tests.property.test_core_properties import Observer, Trace, traces


def _rings(trace: Trace) -> tuple:
    lane = trace.s.lanes[ENDPOINT]
    if not isinstance(lane, Lane):
        return ()
    return (tuple(lane.credit), lane.rounds(),
            tuple(tuple((q.org, q.deficit, q.in_turn, q.live) for q in t.ring)
                  for t in lane.tiers))


class _Calls(Observer):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def batch(self, trace, now, d, before) -> None:
        self.calls.append(("batch", [e.id for e in d.batch], [e.id for e in d.expired],
                           _rings(trace)))

    def expired(self, trace, now, out, before) -> None:
        self.calls.append(("expire", [], [e.id for e in out], _rings(trace)))


def _play(setup, ops) -> list[tuple]:
    seen = _Calls()
    Trace(setup, seen).play(ops)
    return seen.calls


@given(traces())
def test_the_shortcut_takes_what_one_by_one_takes(world):
    setup, ops = world
    shipped = _play(setup, ops)
    with mock.patch.object(Lane, "_take_run", _LaneBase._take_run):
        one_by_one = _play(setup, ops)
    assert shipped == one_by_one


def test_the_shortcut_is_taken_on_a_backlog():
    cfg = config_for(orgs={"a": "t0", "b": "t0"}, quantum=100, max_request_tokens=10,
                     max_batch_tokens=1000, max_batch_size=64)
    s = Scheduler(cfg)
    for i in range(40):
        assert s.push(ENDPOINT, Entry(f"{'ab'[i % 2]}{i}", "ab"[i % 2], "t0", 10))
    runs: list[int] = []
    real = Lane._take_run

    def counted(self, pick, batch, tokens):
        before = len(batch)
        out = real(self, pick, batch, tokens)
        runs.append(len(batch) - before)
        return out

    with mock.patch.object(Lane, "_take_run", counted):
        batch = s.next_batch(ENDPOINT, 0.0).batch
    # A turn of 100 covers ten requests of 10: one picked, nine taken by the shortcut.
    assert [e.org for e in batch] == ["a"] * 10 + ["b"] * 10 + ["a"] * 10 + ["b"] * 10
    assert runs == [9, 9, 9, 9]
