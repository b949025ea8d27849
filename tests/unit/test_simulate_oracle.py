"""The simulator against schedules worked out by hand, not against its own model.

Each scenario is a tiny trace whose every batch was computed on paper from
the design's rules (DESIGN section 2, the docstrings of ``scheduler.drr``
and ``scheduler.lane``) and a round service model: a batch of T tokens takes
10 ms + 1 ms per token. The expected table below each scenario is that
paper schedule: for every request, when its batch was chosen and when it
was done (or when it expired). The simulator must reproduce it exactly.

Notation in the comments: ``d(X)`` is org X's DRR deficit; "turn" is a
grant of ``quantum x weight``; the budget is ``max_batch_tokens``.
"""

from __future__ import annotations

import itertools

import pytest

from schemas.config import parse_config
from tests.core_setup import ENDPOINT, config_dict, config_for
from traffic.simulate import ServiceModel, SimSettings, simulate
from traffic.trace import TraceRecord

#: 10 ms per batch + 1 ms per token: 100 tokens in 0.11 s, 200 in 0.21 s.
ROUND = ServiceModel(overhead_ms=10.0, ms_per_token=1.0)


def rec(rid: str, org: str, tokens: int, ts: float = 0.0, *, priority: int = 0,
        deadline_ms: int | None = None) -> TraceRecord:
    return TraceRecord(ts=ts, org=org, endpoint=ENDPOINT, tokens=tokens, id=rid,
                       priority=priority, deadline_ms=deadline_ms)


def schedule(config, records, **settings) -> dict[str, tuple]:
    """id -> (status, dispatched_s, completed_s) as simulated; without express batches
    unless asked for (the core's own order; express batches have scenarios of their own)."""
    res = simulate(config, records, SimSettings(service=ROUND, **({"express": False}
                                                                  | settings)))
    return {o.id: (o.status, o.dispatched_s, o.completed_s) for o in res.outcomes}


def assert_schedule(got: dict[str, tuple], want: dict[str, tuple]) -> None:
    assert set(got) == set(want)
    for rid, (status, dispatched, completed) in want.items():
        assert got[rid][0] == status, (rid, got[rid])
        assert got[rid][1] == (None if dispatched is None else pytest.approx(dispatched)), (
            rid, got[rid])
        assert got[rid][2] == pytest.approx(completed), (rid, got[rid])


TWO_ORGS = {"a": "t0", "b": "t0"}
# a1..a4 then b1, b2, all 100 tokens, at t = 0 (a joins the ring first).
BURST = [rec(f"a{i}", "a", 100) for i in (1, 2, 3, 4)] + [rec(f"b{i}", "b", 100) for i in (1, 2)]


def test_drr_interleaves_two_orgs_one_request_per_turn():
    """Quantum 100, budget 200, all 100 tokens: each batch holds one request of each org."""
    cfg = config_for(orgs=TWO_ORGS, quantum=100, max_batch_tokens=200)
    # t=0:    a's turn d(a)=100: a1. a2 does not fit d(a)=0, turn passes.
    #         b's turn d(b)=100: b1. Budget full (a2 granted d(a)=100, waits).   -> done 0.21
    # t=0.21: a (still in its turn, d=100): a2; b's turn: b2, b leaves.           -> done 0.42
    # t=0.42: a: a3, then a new turn: a4.                                         -> done 0.63
    assert_schedule(schedule(cfg, BURST), {
        "a1": ("ok", 0.0, 0.21), "b1": ("ok", 0.0, 0.21),
        "a2": ("ok", 0.21, 0.42), "b2": ("ok", 0.21, 0.42),
        "a3": ("ok", 0.42, 0.63), "a4": ("ok", 0.42, 0.63),
    })


def test_fifo_serves_the_same_burst_in_arrival_order():
    """The FIFO baseline on the same trace: b waits behind all of a."""
    cfg = config_for(orgs=TWO_ORGS, quantum=100, max_batch_tokens=200)
    assert_schedule(schedule(cfg, BURST, policy="fifo"), {
        "a1": ("ok", 0.0, 0.21), "a2": ("ok", 0.0, 0.21),
        "a3": ("ok", 0.21, 0.42), "a4": ("ok", 0.21, 0.42),
        "b1": ("ok", 0.42, 0.63), "b2": ("ok", 0.42, 0.63),
    })


def test_weight_two_gets_two_requests_per_round():
    """Weights 2:1, quantum 100, budget 300: every batch is two of a's and one of b's."""
    cfg = config_for(orgs={"a": ("t0", 2.0), "b": ("t0", 1.0)}, quantum=100,
                     max_batch_tokens=300)
    trace = [rec(f"a{i}", "a", 100) for i in range(1, 7)] + \
        [rec(f"b{i}", "b", 100) for i in range(1, 4)]
    # Each round: a's turn d(a)=200 pays two, b's turn d(b)=100 pays one: 300 tokens,
    # 0.31 s a batch.
    assert_schedule(schedule(cfg, trace), {
        "a1": ("ok", 0.0, 0.31), "a2": ("ok", 0.0, 0.31), "b1": ("ok", 0.0, 0.31),
        "a3": ("ok", 0.31, 0.62), "a4": ("ok", 0.31, 0.62), "b2": ("ok", 0.31, 0.62),
        "a5": ("ok", 0.62, 0.93), "a6": ("ok", 0.62, 0.93), "b3": ("ok", 0.62, 0.93),
    })


def test_a_higher_tier_request_takes_the_next_batch():
    """Strict tiers: a gold request arriving mid-batch goes before the free backlog."""
    cfg = config_for(tiers=("gold", "free"), orgs={"g": "gold", "f": "free"}, quantum=100,
                     max_batch_tokens=100)
    trace = [rec("f1", "f", 100), rec("f2", "f", 100), rec("f3", "f", 100),
             rec("g1", "g", 100, ts=0.05)]
    # One request a batch (0.11 s). g1 arrives while f1 is served and is chosen next.
    assert_schedule(schedule(cfg, trace), {
        "f1": ("ok", 0.0, 0.11), "g1": ("ok", 0.11, 0.22),
        "f2": ("ok", 0.22, 0.33), "f3": ("ok", 0.33, 0.44),
    })


def test_priority_then_deadline_within_an_org_and_expiry_at_the_deadline():
    """One org: higher priority first, then the earlier deadline; a request still held at its
    deadline expires then, unserved."""
    raw = config_dict(orgs={"a": "t0"}, quantum=100, max_batch_tokens=100, max_batch_size=1)
    raw["endpoints"][ENDPOINT]["priority_cap"] = {"t0": 9}
    cfg = parse_config(raw)
    trace = [rec("p", "a", 100, priority=9), rec("x", "a", 100, ts=0.01),
             rec("y", "a", 100, ts=0.02, priority=5),
             rec("z", "a", 100, ts=0.03, priority=5, deadline_ms=1000),
             rec("w", "a", 100, ts=0.04, deadline_ms=50)]
    # p alone at t=0 (0..0.11); the rest arrive while it is served. w's deadline
    # (0.04 + 0.05) passes first: expired at 0.09, unserved. At 0.11: z (p5, a deadline)
    # before y (p5, none, though it came first), then x (p0).
    assert_schedule(schedule(cfg, trace), {
        "p": ("ok", 0.0, 0.11), "w": ("expired", None, 0.09),
        "z": ("ok", 0.11, 0.22), "y": ("ok", 0.22, 0.33), "x": ("ok", 0.33, 0.44),
    })


def test_two_slots_choose_the_second_batch_early_and_run_it_after_the_first():
    """A worker with two slots takes two batches at t=0 and runs them one after the other;
    the third is chosen when the first is done and starts when the second is."""
    cfg = config_for(orgs=TWO_ORGS, quantum=100, max_batch_tokens=200)
    assert_schedule(schedule(cfg, BURST, slots=2), {
        "a1": ("ok", 0.0, 0.21), "b1": ("ok", 0.0, 0.21),
        "a2": ("ok", 0.0, 0.42), "b2": ("ok", 0.0, 0.42),
        "a3": ("ok", 0.21, 0.63), "a4": ("ok", 0.21, 0.63),
    })


def test_adaptive_cost_from_one_batch_of_feedback():
    """Adaptive cost, EMA alpha 0.5: after one batch of a 10-token and a 90-token request, the
    short org's next request costs 10 x 27/23 and the long org's 90 x 19/23."""
    cfg = config_for(orgs={"s": "t0", "l": "t0"}, cost_model="adaptive", quantum=400,
                     max_batch_tokens=100, max_request_tokens=100, ema_alpha=0.5)
    trace = [rec("s1", "s", 10), rec("l1", "l", 90), rec("s2", "s", 10, ts=1.0),
             rec("l2", "l", 90, ts=1.0)]
    # Batch 1 (0.11 s): 10 ms overhead shared by two requests, so s1 took 5 + 10 = 15 ms
    # (1.5 ms/token) and l1 5 + 90 = 95 ms (19/18 ms/token). Fed back in batch order:
    # endpoint EMA 1.5, then (1.5 + 19/18) / 2 = 23/18; s's ratio 1.5 / (23/18) = 27/23,
    # l's (19/18) / (23/18) = 19/23. Before any feedback a request costs its tokens.
    res = simulate(cfg, trace, SimSettings(service=ROUND))
    cost = {o.id: o.cost for o in res.outcomes}
    assert cost["s1"] == 10 and cost["l1"] == 90
    assert cost["s2"] == pytest.approx(10 * 27 / 23)
    assert cost["l2"] == pytest.approx(90 * 19 / 23)
    assert_schedule({o.id: (o.status, o.dispatched_s, o.completed_s) for o in res.outcomes}, {
        "s1": ("ok", 0.0, 0.11), "l1": ("ok", 0.0, 0.11),
        "s2": ("ok", 1.0, 1.11), "l2": ("ok", 1.0, 1.11),
    })


# -- express batches (scheduler/dispatch.py): the live scheduler's, on by default -----------

QUIET_UNDER_BURST = {"f": "t0", "q": "t0", "r": "t0"}
F4 = [rec(f"f{i}", "f", 100) for i in (1, 2, 3, 4)]


def test_an_express_batch_runs_after_the_batch_in_progress_ahead_of_the_queued_one():
    """Budget 100: one request a batch (0.11 s); two slots. q1 comes at 0.05 with nothing
    held while both slots are taken: it goes out at once alone, runs when f1 ends, and f2,
    queued, moves back by its 0.11 s."""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=100)
    trace = [*F4, rec("q1", "q", 100, ts=0.05)]
    # t=0:    f1 (0..0.11), f2 queued (0.11..0.22). Both slots taken.
    # t=0.05: q1, express: after f1, 0.11..0.22; f2 moves to 0.22..0.33.
    # t=0.11: f1 done: q1 and f2 in hand, both slots taken, nobody fresh.
    # t=0.22: q1 done: f3 chosen, after f2: 0.33..0.44.  t=0.33: f2 done: f4, 0.44..0.55.
    assert_schedule(schedule(cfg, trace, slots=2, express=True), {
        "f1": ("ok", 0.0, 0.11), "q1": ("ok", 0.05, 0.22), "f2": ("ok", 0.0, 0.33),
        "f3": ("ok", 0.22, 0.44), "f4": ("ok", 0.33, 0.55),
    })
    # Its outcome says so (the report counts it; Jain's index leaves it out, as live).
    res = simulate(cfg, trace, SimSettings(service=ROUND, slots=2))
    assert {o.id for o in res.outcomes if o.express} == {"q1"}
    # Without it q1 waits for the queued f2 and for f3, which DRR chose at 0.11.
    assert schedule(cfg, trace, slots=2)["q1"] == ("ok", pytest.approx(0.22),
                                                   pytest.approx(0.44))


def test_one_express_batch_per_worker_until_it_starts():
    """r1 comes at 0.06, while q1's express batch waits for f1 to end: no second one then.
    At 0.11 q1 starts (the live worker returns its credit), and r1 goes out in its own,
    run after q1."""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=100)
    trace = [*F4, rec("q1", "q", 100, ts=0.05), rec("r1", "r", 100, ts=0.06)]
    # t=0.05: q1 express, 0.11..0.22 (f2 to 0.22..0.33).  t=0.06: r1 waits.
    # t=0.11: f1 done, q1 starts: r1 express, after q1: 0.22..0.33; f2 to 0.33..0.44.
    # t=0.22: q1 done: r1 and f2 still hold both slots (r1 beyond them until now).
    # t=0.33: r1 done: f3, after f2: 0.44..0.55.  t=0.44: f2 done: f4, 0.55..0.66.
    assert_schedule(schedule(cfg, trace, slots=2, express=True), {
        "f1": ("ok", 0.0, 0.11), "q1": ("ok", 0.05, 0.22), "r1": ("ok", 0.11, 0.33),
        "f2": ("ok", 0.0, 0.44), "f3": ("ok", 0.33, 0.55), "f4": ("ok", 0.44, 0.66),
    })


class _Pipeline:
    """A calibrated pipeline with no admission or delivery delay: the scheduler hears a
    worker's news ``feedback_s`` late, and ``serve`` times a batch (``Pipeline.serve``)."""

    def __init__(self, feedback_s, serve):
        self.feedback = feedback_s
        self.serve = serve

    def enter_times(self, records):
        return [r.ts for r in records]

    def delivery_s(self, endpoint):
        return 0.0

    def feedback_s(self, endpoint):
        return self.feedback

    def slots(self, endpoint):
        return None


def _late_news():
    """News 50 ms late; a batch is one call, its credit back 30 ms before its end (at
    its last call's start, as live)."""

    def serve(endpoint, entries):
        took = ROUND.batch_s(sum(e.tokens for e in entries))
        return took, [took] * len(entries), took - 0.03

    return _Pipeline(0.05, serve)


def _one_call_per_request():
    """No hops; each request of a batch a call of its own (0.11 s for 100 tokens), the
    batch's credit back as its last call starts."""

    def serve(endpoint, entries):
        ends = list(itertools.accumulate(ROUND.batch_s(e.tokens) for e in entries))
        return ends[-1], ends, ends[-2] if len(ends) > 1 else 0.0

    return _Pipeline(0.0, serve)


class _Watching:
    """Admission that admits everything and keeps the lane's rate of every snapshot."""

    def __init__(self):
        self.rates: list[float] = []

    def observe(self, state, now):
        self.rates.append(state.lanes[ENDPOINT].tokens_per_s)

    def admit(self, record, tier, now):
        return None


def test_the_next_express_batch_goes_when_the_scheduler_hears_the_one_before_started():
    """q1's express batch starts at 0.11 (f1's end); the scheduler hears so 50 ms later,
    at 0.16, and sends r1 (waiting since 0.06) then: not at 0.13, when f1's credit is
    heard (q1 not known to have started), nor at the next event after 0.16."""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=100)
    trace = [*F4, rec("q1", "q", 100, ts=0.05), rec("r1", "r", 100, ts=0.06)]
    res = simulate(cfg, trace, SimSettings(service=ROUND, slots=2, pipeline=_late_news()))
    got = {o.id: o for o in res.outcomes}
    assert (got["q1"].express, got["r1"].express) == (True, True)
    assert got["q1"].dispatched_s == pytest.approx(0.05)
    assert got["r1"].dispatched_s == pytest.approx(0.16)
    # r1 runs after q1 (0.11..0.22): 0.22..0.33.
    assert got["r1"].completed_s == pytest.approx(0.33)


def test_an_express_call_runs_after_the_call_in_progress_not_after_the_whole_batch():
    """Budget 200, one slot: f1 and f2 go out together, run as two calls (0..0.11,
    0.11..0.22). q1 comes at 0.05: its express call runs when f1's call ends, 0.11..0.22,
    and f2's call moves back to 0.22..0.33, as the live worker's model thread orders them.
    The batch's credit comes back as its last call starts (0.22): f3 and f4 then. (The
    express batch carries q1 alone: ``express_fill`` 0.)"""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=200)
    trace = [*F4, rec("q1", "q", 100, ts=0.05)]
    res = simulate(cfg, trace, SimSettings(service=ROUND, slots=1, express_fill=0.0,
                                           pipeline=_one_call_per_request()))
    got = {o.id: (o.dispatched_s, o.completed_s) for o in res.outcomes}
    assert got == {"f1": (0.0, pytest.approx(0.11)), "f2": (0.0, pytest.approx(0.33)),
                   "q1": (0.05, pytest.approx(0.22)),
                   "f3": (pytest.approx(0.22), pytest.approx(0.44)),
                   "f4": (pytest.approx(0.22), pytest.approx(0.55))}


def test_a_batch_split_by_an_express_call_is_measured_at_its_own_speed():
    """The rate the throttle divides by is the batches' own: f1+f2's 200 tokens took 0.22 s
    of calls, not the 0.33 s the express call stretched them to (all calls run at
    200 / 0.22 tokens/s, so the snapshot says exactly that)."""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=200)
    trace = [*F4, rec("q1", "q", 100, ts=0.05), rec("r1", "r", 100, ts=1.0)]
    watch = _Watching()
    simulate(cfg, trace, SimSettings(service=ROUND, slots=1, pipeline=_one_call_per_request(),
                                     admission=watch))
    assert watch.rates[-1] == pytest.approx(200 / 0.22)


def test_batches_full_by_count_set_the_rate_as_live():
    """Batches of 4 requests of 10 tokens are full by count (max_batch_size 4) at 4 % of
    their 1,000 tokens: the simulated rate the throttle reads is theirs (40 tokens in
    10 + 40 ms), as the live ServiceRate measures it; under half full by both, none."""

    def rate(size: int, per_batch: int) -> float:
        cfg = config_for(orgs={"f": "t0", "z": "t0"}, quantum=100, max_batch_tokens=1000,
                         max_batch_size=size)
        trace = [rec(f"f{i}", "f", 10) for i in range(per_batch * 3)] + [
            rec("z1", "z", 10, ts=5.0)]
        watch = _Watching()
        simulate(cfg, trace, SimSettings(service=ROUND, admission=watch))
        return watch.rates[-1]

    assert rate(4, 4) == pytest.approx(40 / 0.05)
    assert rate(64, 4) == 0.0  # 4 of 64 requests and 40 of 1,000 tokens: not measured


def test_no_express_batch_under_fifo():
    """FIFO serves in arrival order: q1 is not taken ahead (the live lane says so too)."""
    cfg = config_for(orgs=QUIET_UNDER_BURST, quantum=100, max_batch_tokens=100)
    trace = [*F4, rec("q1", "q", 100, ts=0.05)]
    got = schedule(cfg, trace, slots=2, express=True, policy="fifo")
    assert got["q1"] == ("ok", pytest.approx(0.33), pytest.approx(0.55))
