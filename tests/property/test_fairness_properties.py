"""The live fairness watch against the property tests' own runs and notion of backlogged.

:class:`scheduler.fairness.FairnessWatch` is fed from the same generated
traces and backlogs as ``test_core_properties`` (its :class:`Trace`, whose
``count`` says who is backlogged: an org holding at least one request), the
way the service feeds it: who holds work before each batch, what the batch
charged, who holds work after it. Then:

* under DRR its gap never exceeds the bound it reports (the core's bound);
* its gap, longest wait and Jain's index equal a brute-force oracle that
  recomputes them from the whole history at every batch;
* a backlogged min_share tier's share never falls below the floor it reports.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import event, given, note, target
from hypothesis import strategies as st

from scheduler.fairness import FairnessWatch, drr_bound, jain
from tests.core_setup import ENDPOINT
from tests.property.test_core_properties import (
    HEAVY,
    Observer,
    Setup,
    Trace,
    backlogs,
    play_backlog,
    traces,
)

EPS = 1e-6
#: Longer than any generated run: the window never drops anything.
FOREVER = 1e9


class Feed(Observer):
    """Feeds a FairnessWatch from a Trace, with join serials from ``trace.count``."""

    def __init__(self, setup: Setup, window_s: float = FOREVER):
        self.setup = setup
        self.watch = FairnessWatch(setup.cfg, window_s)
        self.serial: dict[str, int] = {}
        self.n = 0
        self.oracle = Oracle(setup)

    def held(self, counts) -> dict[str, dict[str, int]]:
        """tier -> {org: serial} for orgs holding work; a new serial on each 0 -> 1."""
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for org, (tier, _) in self.setup.orgs.items():
            if counts.get(org, 0) > 0:
                if org not in self.serial:
                    self.n += 1
                    self.serial[org] = self.n
                out[tier][org] = self.serial[org]
            else:
                self.serial.pop(org, None)
        return out

    def _sync(self, trace: Trace) -> None:
        h = self.held(trace.count)
        self.watch.held(trace.clock.now, ENDPOINT, h)
        self.oracle.sync(trace.clock.now, h)

    def pushed(self, trace, e):
        self._sync(trace)

    def expired(self, trace, now, out, before):
        self._sync(trace)

    def removed(self, trace, e):
        self._sync(trace)

    def batch(self, trace, now, d, before):
        # Expiry comes first inside next_batch: who held work when the batch was chosen.
        pre = defaultdict(int)
        gone = {e.id for e in d.expired}
        for e in before.values():
            if e.id not in gone:
                pre[e.org] += 1
        h = self.held(pre)
        self.watch.held(now, ENDPOINT, h)
        self.oracle.sync(now, h)
        charges = [(e.tier, e.org, trace.cost(e)) for e in d.batch]
        after = self.held(trace.count)
        self.watch.served(now, ENDPOINT, charges, after)
        self.oracle.served(now, charges, after)
        self.check(now)

    def check(self, now: float) -> None:
        """Called after every batch."""


class Oracle:
    """Gap, waits and Jain recomputed from scratch, from the whole history."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.periods: dict[str, tuple[int, float, int]] = {}  # org -> (serial, start, log index)
        self.log: list[tuple[float, dict[str, float]]] = []  # per batch: normalised cost per org
        self.worst_gap: dict[str, float] = defaultdict(float)
        self.waiting: dict[str, float] = {}
        self.longest: dict[str, float] = defaultdict(float)
        self.sets: dict[tuple[str, frozenset], dict[str, float]] = {}

    def weight(self, org: str) -> float:
        return self.setup.orgs[org][1]

    def tier(self, org: str) -> str:
        return self.setup.orgs[org][0]

    def sync(self, now: float, held) -> None:
        flat = {org: serial for orgs in held.values() for org, serial in orgs.items()}
        for org in list(self.periods):
            if flat.get(org) != self.periods[org][0]:
                del self.periods[org]
                self._wait_ends(now, org)
                del self.waiting[org]
        for org, serial in flat.items():
            if org not in self.periods:
                self.periods[org] = (serial, now, len(self.log))
                self.waiting[org] = now

    def _wait_ends(self, now: float, org: str) -> None:
        t = self.tier(org)
        self.longest[t] = max(self.longest[t], now - self.waiting[org])

    def served(self, now: float, charges, after) -> None:
        got: dict[str, float] = defaultdict(float)
        raw: dict[str, float] = defaultdict(float)
        for _, org, cost in charges:
            if org in self.periods:
                got[org] += cost / self.weight(org)
            raw[org] += cost
        self.log.append((now, dict(got)))
        for org in got:
            self._wait_ends(now, org)
            self.waiting[org] = now
        self.sync(now, after)
        # Pairs still backlogged together after the batch, over their common backlog.
        orgs = list(self.periods)
        for i, a in enumerate(orgs):
            for b in orgs[i + 1:]:
                if self.tier(a) != self.tier(b):
                    continue
                since = max(self.periods[a][2], self.periods[b][2])
                sa = sum(c.get(a, 0.0) for _, c in self.log[since:])
                sb = sum(c.get(b, 0.0) for _, c in self.log[since:])
                t = self.tier(a)
                self.worst_gap[t] = max(self.worst_gap[t], abs(sa - sb))
        by_tier: dict[str, set[str]] = defaultdict(set)
        for org in self.periods:
            by_tier[self.tier(org)].add(org)
        for t, members in by_tier.items():
            if len(members) >= 2:
                acc = self.sets.setdefault((t, frozenset(members)), defaultdict(float))
                for org in members:
                    acc[org] += raw.get(org, 0.0)

    def longest_wait(self, now: float, tier: str) -> float:
        running = [now - self.waiting[o] for o in self.waiting if self.tier(o) == tier]
        return max([self.longest[tier], *running])

    def jain(self, tier: str) -> float:
        mine = [(k, v) for k, v in self.sets.items() if k[0] == tier]
        if not mine:
            return 1.0
        (_, key), served = max(mine, key=lambda kv: (sum(kv[1].values()), sorted(kv[0][1])))
        return jain(served[o] / self.weight(o) for o in key)


#: How often each conditional check of a run below actually ran (it runs only
#: where a generated case has what it checks): asserted nonzero, so a generator
#: that stops producing such cases fails instead of checking nothing.
RAN: dict[str, int] = defaultdict(int)


@given(traces(n_tiers=(1, 2), n_orgs=(2, 5)))
def _live_gap_within_bound(world):
    setup, ops = world
    worst = [0.0]
    floors = [0]

    class Check(Feed):
        def check(self, now):
            RAN["batches checked"] += 1
            for tf in self.watch.figures(now)[ENDPOINT].tiers.values():
                assert tf.bound == drr_bound(setup.cfg, ENDPOINT, tf.tier)
                assert tf.gap <= tf.bound + EPS, (tf, self.watch.config)
                worst[0] = max(worst[0], tf.gap / tf.bound)
                if tf.share_floor is not None:
                    floors[0] += 1
                    assert tf.share >= tf.share_floor - EPS, tf

    Trace(setup, Check(setup)).play(ops)
    RAN["share floors checked"] += floors[0]
    event(f"share floor checked: {'yes' if floors[0] else 'no'}")
    target(worst[0], label="live gap / bound")


def test_under_drr_the_live_gap_stays_within_the_bound_it_reports():
    """DRR: every tier's gap stays <= its bound, and a min_share tier's share >= its floor, always;
    and across the generated cases both checks ran (the floor's in some of them)."""
    RAN.clear()
    _live_gap_within_bound()
    assert RAN["batches checked"] > 0, dict(RAN)
    assert RAN["share floors checked"] > 0, dict(RAN)


@given(traces(n_tiers=(1, 2), n_orgs=(2, 5), policies=("drr", "fifo")))
def test_the_watch_agrees_with_a_brute_force_oracle(world):
    """Gap, longest wait and Jain's index equal their from-scratch recomputation after every batch."""
    setup, ops = world

    class Check(Feed):
        def check(self, now):
            o = self.oracle
            for tier, tf in self.watch.figures(now)[ENDPOINT].tiers.items():
                assert abs(tf.gap - o.worst_gap[tier]) <= EPS, (tier, tf.gap, o.worst_gap)
                assert abs(tf.longest_wait_s - o.longest_wait(now, tier)) <= EPS
                assert abs(tf.jain - o.jain(tier)) <= EPS, (tier, tf.jain, o.jain(tier))
                assert tf.backlogged == sum(1 for org in o.periods if o.tier(org) == tier)

    note(f"policy {setup.policy}")
    Trace(setup, Check(setup)).play(ops)


@HEAVY
@given(backlogs(n_tiers=(2, 3), n_orgs=(3, 6), shares="required", every_tier_used=True),
       st.sampled_from([1.0, 4.0, 16.0, FOREVER]))
def test_a_backlogged_min_share_tier_stays_above_its_floor(world, window_s):
    """Backlogged min_share tiers: the window's share >= the floor the watch reports, always."""
    setup, rng, n_batches = world
    watch = FairnessWatch(setup.cfg, window_s)
    held = {t: {o: 1 for o, (tier, _) in setup.orgs.items() if tier == t}
            for t in setup.cfg.tier_names}
    clock = [0.0]
    watch.held(0.0, ENDPOINT, held)

    floors = [0]

    def on_select(e, cost):
        # Each selection as a batch of its own: the min_share guarantee holds per selection.
        clock[0] += 0.25
        watch.served(clock[0], ENDPOINT, [(e.tier, e.org, cost)], held)
        for tf in watch.figures(clock[0])[ENDPOINT].tiers.values():
            if tf.share_floor is not None:
                floors[0] += 1
                assert tf.share >= tf.share_floor - EPS, tf

    play_backlog(setup, rng, n_batches, on_select)
    # Every case has a min_share tier, backlogged, and at least one batch: the floor
    # check must have run, or this test checked nothing.
    assert floors[0] > 0, (n_batches, setup.cfg.tiers)
