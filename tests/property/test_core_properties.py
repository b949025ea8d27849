"""The fairness invariants of the scheduler core, as hypothesis properties.

Three kinds of run:

* a *trace* (:func:`traces`): random pushes, batches, expiries, feedback and
  clock advances on one lane, then a final drain; :class:`Trace` replays it
  on a fake clock while keeping its own model of what is held, and each
  property test checks one invariant at every call;
* a *backlog* (:func:`backlogs`): every org has more requests than the run
  can serve, so the DRR and min-share bounds, stated for continuously
  backlogged orgs, apply at every selection;
* a state machine (:class:`SchedulerMachine`) interleaving pushes (some
  duplicates), batches on two endpoints, expiries, removals, feedback,
  reconfiguration and clock advances, checking the books after every step.

Bounds are the ones the ``scheduler`` package docstring states, with
``max_cost`` the endpoint's largest request cost (``Config.max_request_cost``).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgspec
from hypothesis import HealthCheck, given, note, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scheduler import Dispatch, Entry, Scheduler
from scheduler.entry import DISPATCHED, EXPIRED, HELD, NO_DEADLINE, REMOVED
from schemas.config import Config
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for

#: Heavier tests run a fraction of the profile's examples (``long`` scales them all).
EXAMPLES = settings().max_examples
HEAVY = settings(max_examples=max(10, EXAMPLES // 4),
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EPS = 1e-6

# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setup:
    """One lane's configuration, and the orgs (tier, weight) that will use it."""

    cfg: Config
    orgs: dict[str, tuple[str, float]]
    policy: str = "drr"

    @property
    def endpoint(self):
        return self.cfg.endpoints[ENDPOINT]

    @property
    def max_cost(self) -> float:
        return self.cfg.max_request_cost(ENDPOINT)

    def rank(self, tier: str) -> int:
        return self.cfg.tier_rank(tier)

    def turn(self, org: str) -> float:
        """What one DRR turn grants ``org``: quantum x weight."""
        return self.endpoint.quantum * self.orgs[org][1]


@st.composite
def setups(draw, *, n_tiers=(1, 3), shares: bool = True, weights=(0.5, 1.0, 2.0, 3.0),
           n_orgs=(1, 5), cost_models=("requests", "tokens", "adaptive"),
           policies=("drr",), every_tier_used: bool = False) -> Setup:
    """A checked configuration; ``shares="required"`` gives the lowest tier a min_share."""
    tiers = [f"t{i}" for i in range(draw(st.integers(*n_tiers)))]
    min_share = {}
    if shares:
        for t in tiers[1:]:
            if draw(st.booleans()) or (shares == "required" and t == tiers[-1]):
                min_share[t] = draw(st.sampled_from([0.1, 0.2, 0.3]))
    cost_model = draw(st.sampled_from(cost_models))
    mrt = draw(st.integers(1, 64))
    orgs = {}
    for i in range(draw(st.integers(*n_orgs))):
        tier = tiers[i] if every_tier_used and i < len(tiers) else draw(st.sampled_from(tiers))
        orgs[f"o{i}"] = (tier, draw(st.sampled_from(weights)))
    max_cost = {"requests": 1.0, "tokens": float(mrt), "adaptive": 4.0 * mrt}[cost_model]
    min_weight = min([w for _, w in orgs.values()] + [1.0])
    quantum = max_cost / min_weight * draw(st.sampled_from([1.0, 1.5, 3.0]))
    cfg = config_for(
        tiers=tiers, min_share=min_share, cost_model=cost_model, quantum=quantum,
        max_request_tokens=mrt, max_batch_tokens=mrt * draw(st.integers(1, 4)),
        max_batch_size=draw(st.integers(1, 8)), orgs=orgs,
    )
    return Setup(cfg, orgs, draw(st.sampled_from(policies)))


# ----------------------------------------------------------------------------- traces

half = st.integers(0, 16).map(lambda n: n / 2)  # times on a half-second grid: exact floats


#: Operation kinds of a trace, by the first byte of a 5-byte record (pushes and
#: batches more often). A record of zeros is a push: hypothesis shrinks toward it.
KINDS = ("push", "push", "push", "batch", "batch", "advance", "expire", "duplicate", "feedback",
         "remove")
BURSTS = (1, 1, 1, 1, 4, 12)  # bursts fill an org's queue past one turn


def decode_ops(setup: Setup, raw: bytes) -> list[tuple]:
    """Operations from bytes: one flat draw is far cheaper to generate than nested strategies.

    Each org first gets a style, so that the interesting cases are likely: an org
    of many small requests (many per turn), an org all of whose requests expire
    together, and so on. Times are on a half-second grid, so they are exact.
    """
    orgs = sorted(setup.orgs)
    mrt = setup.endpoint.max_request_tokens
    small = max(1, mrt // 8)
    style = {org: (raw[i] % 2, raw[i] // 2 % 3) for i, org in enumerate(orgs)}
    ops: list[tuple] = []
    for i in range(len(orgs), len(raw) - 4, 5):
        k, a, b, c, d = raw[i:i + 5]
        kind = KINDS[k % len(KINDS)]
        org = orgs[a % len(orgs)]
        if kind == "push":
            small_only, deadlines = style[org]
            tokens = 1 + b % (small if small_only else mrt)
            deadline = (None, [0.5, 1.0][c // 3 % 2], None if c // 6 % 2 else c // 12 % 17 / 2
                        )[deadlines]
            ops.append(("push", org, tokens, c % 3, deadline, (d % 9 - 4) / 2,
                        BURSTS[d // 9 % len(BURSTS)]))
        elif kind == "advance":
            ops.append(("advance", b % 17 / 2))
        elif kind == "feedback":
            ops.append(("feedback", org, 1 + b % mrt, [0.5, 1.0, 2.0, 8.0][c % 4]))
        elif kind == "remove":
            ops.append(("remove", b))
        else:
            ops.append((kind,))
    return ops


@st.composite
def traces(draw, **setup_kw):
    """A setup and a list of operations on its one lane."""
    setup = draw(setups(**setup_kw))
    # Hypothesis keeps collections short by default; a trace needs steps for queues to form.
    n = draw(st.integers(10, 100))
    raw = draw(st.binary(min_size=5 * n + 8, max_size=5 * n + 8))
    ops = decode_ops(setup, raw)
    note(f"ops: {ops}")
    return setup, ops


class Observer:
    """Checks one invariant as a :class:`Trace` plays; every hook is optional."""

    def pushed(self, trace: Trace, e: Entry) -> None: ...

    def batch(self, trace: Trace, now: float, d: Dispatch, before: dict[str, Entry]) -> None: ...

    def expired(self, trace: Trace, now: float, out: list[Entry],
                before: dict[str, Entry]) -> None: ...

    def removed(self, trace: Trace, e: Entry) -> None: ...


@dataclass
class Trace:
    """Replays a trace on a fake clock and keeps a model of what the scheduler holds."""

    setup: Setup
    observer: Observer = field(default_factory=Observer)
    clock: FakeClock = field(default_factory=FakeClock)
    held: dict[str, Entry] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    accepted: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # id -> dispatched | expired | removed
    count: Counter = field(default_factory=Counter)  # held requests per org

    def __post_init__(self):
        self.s = Scheduler(self.setup.cfg, self.setup.policy)

    def key(self, e: Entry) -> tuple:
        """The documented per-org order: priority desc, deadline asc, arrival asc, push order."""
        return (-e.priority, e.deadline, e.arrival, self.order[e.id])

    def cost(self, e: Entry) -> float:
        return self.s.lanes[ENDPOINT].cost.cost(e)

    def play(self, ops) -> Trace:
        for op in ops:
            getattr(self, "_" + op[0])(*op[1:])
        for _ in range(10_000):  # drain what is left at the current time
            if not self.held or not self._batch():
                break
        self.clock.advance(1e6)
        self._expire()
        return self

    def _push(self, org: str, tokens: int, priority: int, deadline: float | None,
              jitter: float, count: int = 1) -> None:
        now = self.clock.now
        for _ in range(count):
            e = Entry(f"r{len(self.order)}", org, self.setup.orgs[org][0], tokens,
                      priority=priority, deadline=None if deadline is None else now + deadline,
                      arrival=max(0.0, now + jitter))
            self.order[e.id] = len(self.order)
            assert self.s.push(ENDPOINT, e)
            self.held[e.id] = e
            self.count[org] += 1
            self.accepted.append(e.id)
            self.observer.pushed(self, e)

    def _duplicate(self) -> None:
        if self.held:
            e = next(iter(self.held.values()))
            assert not self.s.push(ENDPOINT, Entry(e.id, e.org, e.tier, e.tokens))

    def _leave(self, entries: list[Entry], how: str) -> None:
        for e in entries:
            assert self.held.pop(e.id, None) is e, f"{e.id} left but was not held"
            self.count[e.org] -= 1
            assert e.id not in self.left
            self.left[e.id] = how

    def _batch(self) -> bool:
        before = dict(self.held)
        d = self.s.next_batch(ENDPOINT, self.clock.now)
        self._leave(d.expired, "expired")
        self._leave(d.batch, "dispatched")
        self.observer.batch(self, self.clock.now, d, before)
        return bool(d.batch)

    def _expire(self) -> None:
        before = dict(self.held)
        out = self.s.expire(self.clock.now)
        self._leave(out, "expired")
        self.observer.expired(self, self.clock.now, out, before)

    def _remove(self, pick: int) -> None:
        """The service takes a held request back (its partition moved): it leaves, undecided."""
        if not self.held:
            assert self.s.remove("not-held") is None
            return
        e = list(self.held.values())[pick % len(self.held)]
        assert self.s.remove(e.id) is e and e.state == REMOVED
        self._leave([e], "removed")
        self.observer.removed(self, e)

    def _advance(self, dt: float) -> None:
        self.clock.advance(dt)

    def _feedback(self, org: str, tokens: int, factor: float) -> None:
        self.s.feedback(ENDPOINT, [(org, tokens, tokens * factor * 1e-3)])


class Waiting:
    """What still waited at one selection of a call: per org, and a count per tier rank."""

    def __init__(self, setup: Setup, d: Dispatch, before: dict[str, Entry]):
        gone = {e.id for e in d.expired}
        self.rank = setup.rank
        self.by_org: dict[str, dict[str, Entry]] = defaultdict(dict)
        self.by_rank: Counter = Counter()
        for w in before.values():
            if w.id not in gone:
                self.by_org[w.org][w.id] = w
                self.by_rank[self.rank(w.tier)] += 1

    def take(self, e: Entry) -> None:
        del self.by_org[e.org][e.id]
        self.by_rank[self.rank(e.tier)] -= 1


def selections(setup: Setup, d: Dispatch, before: dict[str, Entry]):
    """Each dispatched entry, with what still waited (itself included) when it was chosen."""
    waiting = Waiting(setup, d, before)
    for e in d.batch:
        yield e, waiting
        waiting.take(e)


@given(traces(policies=("drr", "fifo")))
def test_every_request_leaves_exactly_once(world):
    """Every accepted request leaves once (dispatched, expired or removed), and never twice."""
    setup, ops = world
    t = Trace(setup).play(ops)
    assert t.held == {} and t.s.held == 0
    assert sorted(t.left) == sorted(t.accepted)


@given(traces(policies=("drr", "fifo")))
def test_expired_requests_are_never_dispatched_and_are_reported_at_once(world):
    """No batch holds a request at or past its deadline; each call reports every one that is due."""

    class Check(Observer):
        def _due(self, now, out, before):
            due = {k for k, e in before.items() if e.deadline <= now}
            assert {e.id for e in out} == due
            assert all(e.state == EXPIRED for e in out)

        def batch(self, trace, now, d, before):
            self._due(now, d.expired, before)
            assert all(e.deadline > now and e.state == DISPATCHED for e in d.batch)

        def expired(self, trace, now, out, before):
            self._due(now, out, before)

    setup, ops = world
    Trace(setup, Check()).play(ops)


@given(traces())
def test_each_org_is_served_in_its_own_order(world):
    """A dispatched request was its org's best waiting one (priority, deadline, arrival, push)."""

    class Check(Observer):
        def batch(self, trace, now, d, before):
            for e, waiting in selections(trace.setup, d, before):
                best = min(waiting.by_org[e.org].values(), key=trace.key)
                assert best is e, f"{e!r} dispatched while {best!r} waited"

    setup, ops = world
    Trace(setup, Check()).play(ops)


@given(traces(policies=("fifo",)))
def test_fifo_baseline_serves_in_arrival_order(world):
    """policy=fifo: each dispatched request was the earliest waiting by (arrival, push order)."""

    class Check(Observer):
        def batch(self, trace, now, d, before):
            for e, waiting in selections(trace.setup, d, before):
                best = min((w for ws in waiting.by_org.values() for w in ws.values()),
                           key=lambda w: (w.arrival, trace.order[w.id]))
                assert best is e, f"{e!r} dispatched before {best!r}"

    setup, ops = world
    Trace(setup, Check()).play(ops)


@given(traces(policies=("drr", "fifo")))
def test_batches_stay_within_budget(world):
    """A batch has at most max_batch_size requests and, beyond its first, max_batch_tokens tokens."""
    setup, ops = world
    ep = setup.endpoint
    sizes = []

    class Check(Observer):
        def batch(self, trace, now, d, before):
            assert len(d.batch) <= ep.max_batch_size
            if len(d.batch) > 1:
                assert sum(e.tokens for e in d.batch) <= ep.max_batch_tokens
            sizes.append(len(d.batch))

    Trace(setup, Check()).play(ops)


@given(traces(policies=("drr", "fifo")))
def test_a_lane_holding_requests_never_returns_an_empty_batch(world):
    """Work conservation: if anything is held after expiry, the batch is not empty."""

    class Check(Observer):
        def batch(self, trace, now, d, before):
            if len(before) > len(d.expired):
                assert d.batch

    setup, ops = world
    Trace(setup, Check()).play(ops)


@given(traces(shares=False, n_tiers=(2, 3)))
def test_no_lower_tier_request_while_a_higher_tier_waits(world):
    """Without min_share, a request is chosen only if no request of a higher tier is waiting."""

    class Check(Observer):
        def batch(self, trace, now, d, before):
            for e, waiting in selections(trace.setup, d, before):
                rank = trace.setup.rank(e.tier)
                assert not any(n for r, n in waiting.by_rank.items() if r < rank), (
                    f"{e!r} chosen while a higher tier waited")

    setup, ops = world
    Trace(setup, Check()).play(ops)


def remaining_by_org(trace: Trace, d: Dispatch, before: dict[str, Entry]) -> Counter:
    """Requests per org still held once the call's expiries are out."""
    return Counter({org: len(ws) for org, ws in Waiting(trace.setup, d, before).by_org.items()})


@given(traces(n_tiers=(1, 2), n_orgs=(2, 4)))
def test_while_an_org_waits_each_other_org_gets_at_most_one_turn(world):
    """While an org waits, each other org of its tier gets at most quantum x weight + max_cost."""

    class Check(Observer):
        def __init__(self):
            self.since: dict[str, dict[str, float]] = {}  # waiting org -> {other org: cost}
            self.worst = 0.0  # largest fraction of the bound seen: hypothesis climbs it

        def _sync(self, trace) -> None:
            self.since = {org: self.since.get(org, {}) for org, n in trace.count.items() if n}

        def pushed(self, trace, e):
            self._sync(trace)

        def expired(self, trace, now, out, before):
            self._sync(trace)

        def removed(self, trace, e):
            self._sync(trace)

        def batch(self, trace, now, d, before):
            left = remaining_by_org(trace, d, before)
            self.since = {org: got for org, got in self.since.items() if left[org]}
            for e in d.batch:
                left[e.org] -= 1
                for org, got in self.since.items():
                    if org != e.org and trace.setup.orgs[org][0] == e.tier:
                        got[e.org] = got.get(e.org, 0.0) + trace.cost(e)
                        bound = trace.setup.turn(e.org) + trace.setup.max_cost
                        self.worst = max(self.worst, got[e.org] / bound)
                        assert got[e.org] <= bound + EPS, (
                            f"{e.org} got {got[e.org]} while {org} waited (bound {bound})")
                if e.org in self.since:
                    self.since[e.org] = {}  # served: a new wait starts now
                if not left[e.org]:
                    del self.since[e.org]
            self._sync(trace)

    setup, ops = world
    check = Check()
    Trace(setup, check).play(ops)
    target(check.worst, label="most served while a peer waited / bound")


@given(traces())
def test_an_org_back_from_idle_has_no_banked_credit(world):
    """An org that emptied and returns gets at most one quantum x weight before a waiting peer is served."""

    class Check(Observer):
        def __init__(self):
            self.run: dict[str, float] = {}  # returned org -> cost served since its return

        def _peers_wait(self, trace, org: str, left) -> bool:
            tier = trace.setup.orgs[org][0]
            return any(n and o != org and trace.setup.orgs[o][0] == tier for o, n in left.items())

        def _drop_unwatched(self, trace, left) -> None:
            self.run = {o: c for o, c in self.run.items() if self._peers_wait(trace, o, left)}

        def pushed(self, trace, e):
            left = trace.count
            if left[e.org] == 1 and self._peers_wait(trace, e.org, left):
                self.run[e.org] = 0.0

        def expired(self, trace, now, out, before):
            self._drop_unwatched(trace, trace.count)

        def removed(self, trace, e):
            self._drop_unwatched(trace, trace.count)

        def batch(self, trace, now, d, before):
            left = remaining_by_org(trace, d, before)
            self._drop_unwatched(trace, left)
            for e in d.batch:
                left[e.org] -= 1
                for org in list(self.run):
                    if org == e.org:
                        self.run[org] += trace.cost(e)
                        assert self.run[org] <= trace.setup.turn(org) + EPS, (org, self.run)
                    elif trace.setup.orgs[org][0] == e.tier:
                        del self.run[org]  # a waiting peer got its turn

    setup, ops = world
    Trace(setup, Check()).play(ops)


@given(setups(n_tiers=(1, 1), n_orgs=(2, 4), cost_models=("requests", "tokens")),
       st.randoms(use_true_random=False), st.integers(1, 12))
def test_an_org_emptied_by_expiry_in_its_turn_rejoins_behind_its_peers(setup, rng, k):
    """An org whose rest expired just after it was served, refilled, is served after each waiting peer."""
    one_at_a_time = msgspec.structs.replace(setup.endpoint, max_batch_size=1)
    s = Scheduler(msgspec.structs.replace(setup.cfg, endpoints={ENDPOINT: one_at_a_time}))
    me, *peers = sorted(setup.orgs)
    mrt = setup.endpoint.max_request_tokens
    for i in range(k):
        s.push(ENDPOINT, Entry(f"me{i}", me, "t0", rng.randint(1, mrt), priority=1))
    for i in range(rng.randint(1, 5)):
        s.push(ENDPOINT, Entry(f"doomed{i}", me, "t0", rng.randint(1, mrt), deadline=1.0))
    n = 0

    def peer_request(org: str) -> Entry:
        nonlocal n
        n += 1
        return Entry(f"{org}-{n}", org, "t0", rng.randint(1, mrt))

    for org in peers:
        s.push(ENDPOINT, peer_request(org))
    served_mine = 0
    for _ in range(100_000):  # until my last servable request has just left: I had the turn
        if served_mine == k:
            break
        [e] = s.next_batch(ENDPOINT, 0.0).batch
        if e.org == me:
            served_mine += 1
        else:
            s.push(ENDPOINT, peer_request(e.org))  # peers stay backlogged
    assert served_mine == k
    assert {e.org for e in s.expire(1.0)} == {me}
    s.push(ENDPOINT, Entry("back", me, "t0", 1))
    waiting = set(peers)
    for _ in range(len(peers)):  # each held one request: one selection each, peers first
        [e] = s.next_batch(ENDPOINT, 1.0).batch
        assert e.org != me, f"{me} served again before {sorted(waiting)}"
        waiting.discard(e.org)
    assert not waiting


# ----------------------------------------------------------------------------- backlogs


@st.composite
def backlogs(draw, **setup_kw):
    """A setup, a seed for request shapes and feedback, and how many batches to take."""
    setup = draw(setups(**setup_kw))
    return setup, draw(st.randoms(use_true_random=False)), draw(st.integers(1, 150))


def play_backlog(setup: Setup, rng: random.Random, n_batches: int, on_select) -> None:
    """Keep every org backlogged through n_batches batches; call on_select(e, cost) per selection.

    Each org holds more than a batch can take from it, and every request served
    is replaced after the batch by a new one of the same org.
    """
    s = Scheduler(setup.cfg)
    ep = setup.endpoint
    clock = FakeClock()
    # Each org has its own size range: an org of large requests loses more of each turn
    # to "the next one does not fit" than an org of small ones; the carried deficit is
    # what keeps them even.
    sizes = {}
    for org in setup.orgs:
        lo = rng.randint(1, ep.max_request_tokens)
        sizes[org] = (lo, rng.randint(lo, ep.max_request_tokens))
    n = 0

    def push(org: str) -> None:
        nonlocal n
        n += 1
        s.push(ENDPOINT, Entry(f"r{n}", org, setup.orgs[org][0], rng.randint(*sizes[org]),
                               priority=rng.randint(0, 1), arrival=clock.now + rng.random()))

    for org in setup.orgs:
        for _ in range(ep.max_batch_size + 1):
            push(org)
    if ep.cost_model == "adaptive":
        s.feedback(ENDPOINT, [(org, 100, rng.uniform(0.01, 0.5)) for org in setup.orgs])
    for _ in range(n_batches):
        batch = s.next_batch(ENDPOINT, clock.now).batch
        assert batch
        for e in batch:
            on_select(e, s.lanes[ENDPOINT].cost.cost(e))
        for e in batch:
            push(e.org)
        if ep.cost_model == "adaptive" and rng.random() < 0.5:
            s.feedback(ENDPOINT, [(e.org, e.tokens, e.tokens * rng.uniform(1e-4, 1e-2))
                                  for e in batch])
        clock.advance(0.5)


@HEAVY
@given(backlogs(n_tiers=(1, 1), weights=(1.0, 1.5, 2.0, 3.0), n_orgs=(2, 6)))
def test_backlogged_orgs_stay_within_the_drr_bound(world):
    """For backlogged orgs i, j: |served_i / w_i - served_j / w_j| <= quantum + 2 x max_cost, always."""
    setup, rng, n_batches = world
    served = dict.fromkeys(setup.orgs, 0.0)
    bound = setup.endpoint.quantum + 2 * setup.max_cost

    def on_select(e, cost):
        served[e.org] += cost
        norm = [served[o] / w for o, (_, w) in setup.orgs.items()]
        assert max(norm) - min(norm) <= bound + EPS, (served, bound)

    play_backlog(setup, rng, n_batches, on_select)


@HEAVY
@given(backlogs(n_tiers=(2, 3), n_orgs=(3, 6), shares="required", every_tier_used=True))
def test_a_backlogged_lower_tier_gets_its_min_share(world):
    """A backlogged tier with min_share s gets within slack of s x all served cost, never more."""
    setup, rng, n_batches = world
    shares = {t.name: t.min_share for t in setup.cfg.tiers if t.min_share}
    slack = (len(shares) + sum(shares.values())) * setup.max_cost
    served = dict.fromkeys((t.name for t in setup.cfg.tiers), 0.0)

    def on_select(e, cost):
        served[e.tier] += cost
        total = sum(served.values())
        for tier, s in shares.items():
            assert s * total - slack - EPS <= served[tier] <= s * total + EPS, (served, tier)

    play_backlog(setup, rng, n_batches, on_select)


# ----------------------------------------------------------------------------- state machine


class SchedulerMachine(RuleBasedStateMachine):
    """Enqueue, dispatch, complete, expire, remove, reconfigure and advance the clock, any order."""

    ENDPOINTS = ("e", "f")

    @initialize(policy=st.sampled_from(["drr", "fifo"]),
                cost_model=st.sampled_from(["requests", "tokens", "adaptive"]),
                shared=st.booleans(), max_batch_size=st.integers(1, 6))
    def start(self, policy, cost_model, shared, max_batch_size):
        self.kw = {
            "tiers": ("gold", "free"), "endpoints": self.ENDPOINTS, "cost_model": cost_model,
            "min_share": {"free": 0.2} if shared else {}, "max_request_tokens": 20,
            "quantum": 160, "max_batch_tokens": 40, "max_batch_size": max_batch_size,
        }
        self.orgs = {"a": ("gold", 1.0), "b": ("gold", 2.0), "c": ("free", 1.0),
                     "d": ("free", 0.5)}
        self.s = Scheduler(config_for(orgs=self.orgs, **self.kw), policy)
        self.clock = FakeClock()
        self.held: dict[str, tuple[str, Entry]] = {}  # id -> (endpoint, entry)
        self.gone: dict[str, Entry] = {}
        self.to_complete: list[list[Entry]] = []
        self.n_pushed = self.n_dispatched = self.n_expired = self.n_removed = 0

    @rule(endpoint=st.sampled_from(ENDPOINTS), org=st.sampled_from("abcd"),
          tokens=st.integers(1, 20), priority=st.integers(0, 3), deadline=st.none() | half,
          jitter=st.integers(-2, 2).map(lambda n: n / 2))
    def push(self, endpoint, org, tokens, priority, deadline, jitter):
        now = self.clock.now
        e = Entry(f"r{self.n_pushed}", org, self.orgs[org][0], tokens, priority=priority,
                  deadline=None if deadline is None else now + deadline,
                  arrival=max(0.0, now + jitter))
        assert self.s.push(endpoint, e)
        self.held[e.id] = (endpoint, e)
        self.n_pushed += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data(), endpoint=st.sampled_from(ENDPOINTS))
    def push_duplicate(self, data, endpoint):
        rid = data.draw(st.sampled_from(sorted(self.held)))
        assert not self.s.push(endpoint, Entry(rid, "a", "gold", 1))

    def _gone(self, entries: list[Entry], endpoint: str | None, state: int) -> None:
        for e in entries:
            ep, held = self.held.pop(e.id)
            assert held is e and e.state == state and endpoint in (None, ep)
            self.gone[e.id] = e

    @rule(endpoint=st.sampled_from(ENDPOINTS))
    def dispatch(self, endpoint):
        d = self.s.next_batch(endpoint, self.clock.now)
        self._gone(d.expired, endpoint, EXPIRED)
        self._gone(d.batch, endpoint, DISPATCHED)
        assert all(e.deadline > self.clock.now for e in d.batch)
        self.n_dispatched += len(d.batch)
        self.n_expired += len(d.expired)
        if d.batch:
            self.to_complete.append(d.batch)
        note(f"{endpoint}: batch {[e.id for e in d.batch]} expired {[e.id for e in d.expired]}")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def remove(self, data):
        rid = data.draw(st.sampled_from(sorted(self.held)))
        e = self.s.remove(rid)
        self._gone([e], None, REMOVED)
        self.n_removed += 1

    @rule()
    def expire(self):
        out = self.s.expire(self.clock.now)
        self._gone(out, None, EXPIRED)
        self.n_expired += len(out)

    @precondition(lambda self: self.to_complete)
    @rule(endpoint=st.sampled_from(ENDPOINTS), slowdown=st.sampled_from([0.5, 1.0, 3.0]))
    def complete(self, endpoint, slowdown):
        batch = self.to_complete.pop(0)
        self.s.feedback(endpoint, [(e.org, e.tokens, e.tokens * 1e-3 * slowdown) for e in batch])

    @rule(dt=half)
    def advance(self, dt):
        self.clock.advance(dt)

    @rule(weights=st.tuples(*[st.sampled_from([0.5, 1.0, 3.0])] * 4), extra_tier=st.booleans())
    def reconfigure(self, weights, extra_tier):
        self.orgs = {org: (tier, w) for (org, (tier, _)), w in zip(self.orgs.items(), weights, strict=True)}
        tiers = ("gold", "free", "spare") if extra_tier else ("gold", "free")
        self.s.reconfigure(config_for(orgs=self.orgs, **{**self.kw, "tiers": tiers}))

    @invariant()
    def books_balance(self):
        """held == pushed - dispatched - expired - removed, in the scheduler, lanes and model."""
        held = self.n_pushed - self.n_dispatched - self.n_expired - self.n_removed
        assert self.s.held == len(self.held) == held
        assert sum(st_.held for st_ in self.s.stats().values()) == held

    @invariant()
    def ids_are_held_once_and_states_agree(self):
        """Every held id is held by the scheduler, HELD; every gone one is not, and final."""
        assert not set(self.held) & set(self.gone)
        for rid, (_, e) in self.held.items():
            assert self.s.holds(rid) and e.state == HELD
        for rid, e in self.gone.items():
            assert not self.s.holds(rid) and e.state in (DISPATCHED, EXPIRED, REMOVED)

    @invariant()
    def lane_counts_match(self):
        """Per endpoint and tier, held counts and tokens match the model."""
        for ep, stats in self.s.stats().items():
            mine = [e for (where, e) in self.held.values() if where == ep]
            for tier in stats.held_by_tier:
                in_tier = [e for e in mine if e.tier == tier]
                assert stats.held_by_tier[tier] == len(in_tier)
                assert stats.held_tokens_by_tier[tier] == sum(e.tokens for e in in_tier)

    @invariant()
    def next_deadline_is_the_earliest_held(self):
        """next_deadline() is the earliest deadline of a held request, or None."""
        deadlines = [e.deadline for _, e in self.held.values() if e.deadline != NO_DEADLINE]
        assert self.s.next_deadline() == (min(deadlines) if deadlines else None)

    def teardown(self):
        if hasattr(self, "s"):  # whatever is left still leaves, once
            for ep in self.ENDPOINTS:
                for _ in range(10_000):
                    if not self.s.lanes[ep].held:
                        break
                    self.dispatch(ep)
            assert self.s.held == 0 == len(self.held)


SchedulerMachine.TestCase.settings = settings(
    max_examples=max(10, EXAMPLES // 4), stateful_step_count=40,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_state_machine = SchedulerMachine.TestCase
