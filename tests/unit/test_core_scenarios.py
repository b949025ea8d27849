"""Fairness scenarios as data, checked against a max-min fair oracle within a margin.

After kubernetes' fairqueuing ``queueset_test.go``: each :class:`Scenario`
lists its clients (org, tier, weight, request size, offered load) and the
lane's settings, and :meth:`Scenario.exercise` runs it on a fake clock, one
batch per tick, and compares each org's share of the served work with the
expected share: by default :func:`fair_alloc` (weighted water-filling) over
the measured capacity, or an explicit table where tiers or the FIFO
baseline make the answer something else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from scheduler import Entry, Scheduler
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for

BACKLOGGED = math.inf


def fair_alloc(demands: dict[str, float], weights: dict[str, float],
               capacity: float) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than asked, the rest by weight."""
    alloc = dict.fromkeys(demands, 0.0)
    open_ = set(demands)
    left = capacity
    while open_ and left > 1e-12:
        level = left / sum(weights[o] for o in open_)
        capped = {o for o in open_ if demands[o] - alloc[o] <= level * weights[o]}
        if not capped:
            for o in open_:
                alloc[o] += level * weights[o]
            break
        for o in capped:
            left -= demands[o] - alloc[o]
            alloc[o] = demands[o]
        open_ -= capped
    return alloc


def test_fair_alloc_oracle():
    """The oracle itself: demands under the level are met, the rest is split by weight."""
    got = fair_alloc({"a": 10, "b": BACKLOGGED, "c": BACKLOGGED}, {"a": 1, "b": 1, "c": 3}, 90)
    assert got == pytest.approx({"a": 10, "b": 20, "c": 60})
    assert fair_alloc({"a": 5, "b": 5}, {"a": 1, "b": 1}, 100) == {"a": 5, "b": 5}


@dataclass(frozen=True)
class Client:
    org: str
    tier: str = "t0"
    weight: float = 1.0
    tokens: int = 50
    #: Tokens offered per tick; BACKLOGGED keeps the org's queue never empty.
    rate: float = BACKLOGGED
    #: True serving cost, fed back to the adaptive cost model.
    seconds_per_token: float = 0.001


@dataclass(frozen=True)
class Scenario:
    name: str
    clients: tuple[Client, ...]
    tiers: tuple[str, ...] = ("t0",)
    min_share: dict[str, float] = field(default_factory=dict)
    cost_model: str = "tokens"
    quantum: float = 256
    max_batch_tokens: int = 512
    policy: str = "drr"
    #: What a share measures: "tokens", "requests" or "seconds" (tokens x seconds_per_token).
    unit: str = "tokens"
    ticks: int = 400
    warmup: int = 40
    #: Expected shares per org; None: the fair_alloc oracle.
    expected: dict[str, float] | None = None
    margin: float = 0.02

    def _work(self, c: Client, tokens: int) -> float:
        return {"tokens": tokens, "requests": 1, "seconds": tokens * c.seconds_per_token}[self.unit]

    def exercise(self) -> dict[str, float]:
        clients = {c.org: c for c in self.clients}
        cfg = config_for(
            tiers=self.tiers, min_share=self.min_share, cost_model=self.cost_model,
            quantum=self.quantum, max_batch_tokens=self.max_batch_tokens,
            max_request_tokens=max(c.tokens for c in self.clients),
            orgs={c.org: (c.tier, c.weight) for c in self.clients},
        )
        s = Scheduler(cfg, policy=self.policy)
        clock = FakeClock()
        offered = dict.fromkeys(clients, 0.0)
        queued = dict.fromkeys(clients, 0)
        served = dict.fromkeys(clients, 0.0)
        n = 0
        for tick in range(self.ticks):
            for c in self.clients:
                if c.rate == BACKLOGGED:
                    want = max(0, 2 * self.max_batch_tokens // c.tokens - queued[c.org])
                else:
                    offered[c.org] += c.rate
                    want = int(offered[c.org] // c.tokens)
                    offered[c.org] -= want * c.tokens
                for _ in range(want):
                    n += 1
                    s.push(ENDPOINT, Entry(f"r{n}", c.org, c.tier, c.tokens, arrival=clock.now))
                queued[c.org] += want
            batch = s.next_batch(ENDPOINT, clock.now).batch
            for e in batch:
                queued[e.org] -= 1
                if tick >= self.warmup:
                    served[e.org] += self._work(clients[e.org], e.tokens)
            s.feedback(ENDPOINT, [(e.org, e.tokens, e.tokens * clients[e.org].seconds_per_token)
                                  for e in batch])
            clock.advance(0.01)
        total = sum(served.values())
        return {org: w / total for org, w in served.items()}

    def oracle(self) -> dict[str, float]:
        if self.expected is not None:
            return self.expected
        # Capacity per tick in the scenario's unit: the budget, in units of the request size.
        per_tick = {
            c.org: (BACKLOGGED if c.rate == BACKLOGGED else
                    self._work(c, c.tokens) * c.rate / c.tokens)
            for c in self.clients
        }
        unit_cap = self._capacity()
        alloc = fair_alloc(per_tick, {c.org: c.weight for c in self.clients}, unit_cap)
        total = sum(alloc.values())
        return {org: a / total for org, a in alloc.items()}

    def _capacity(self) -> float:
        # Backlogged clients fill every batch to max_batch_tokens (request sizes divide it).
        return {"tokens": self.max_batch_tokens}.get(self.unit, BACKLOGGED)


SCENARIOS = [
    Scenario("equal orgs split evenly",
             (Client("a"), Client("b"), Client("c"))),
    Scenario("weights 1:2:3 split 1/6, 2/6, 3/6",
             (Client("a", weight=1), Client("b", weight=2), Client("c", weight=3)),
             quantum=64),
    Scenario("request size buys no share of tokens",
             (Client("small", tokens=16), Client("large", tokens=256))),
    Scenario("cost_model=requests shares requests, not tokens",
             (Client("small", tokens=16), Client("large", tokens=256)),
             cost_model="requests", quantum=1, unit="requests",
             expected={"small": 0.5, "large": 0.5}),
    Scenario("a light org gets all it asks, the heavy ones split the rest",
             (Client("light", tokens=32, rate=64), Client("h1", tokens=64),
              Client("h2", tokens=64))),
    Scenario("adaptive cost equalises serving time, not tokens",
             (Client("slow", seconds_per_token=0.002), Client("fast", seconds_per_token=0.001)),
             cost_model="adaptive", quantum=1024, unit="seconds",
             expected={"slow": 0.5, "fast": 0.5}, margin=0.04),
    Scenario("a backlogged higher tier takes everything",
             (Client("g", tier="gold"), Client("f", tier="free")),
             tiers=("gold", "free"), expected={"g": 1.0, "f": 0.0}, margin=0.0),
    Scenario("min_share 0.25 guarantees a lower tier a quarter",
             (Client("g", tier="gold"), Client("f1", tier="free"), Client("f2", tier="free")),
             tiers=("gold", "free"), min_share={"free": 0.25},
             expected={"g": 0.75, "f1": 0.125, "f2": 0.125}),
    Scenario("overload: DRR splits evenly whatever the arrival rates",
             (Client("heavy", rate=1600), Client("light", rate=400))),
    Scenario("overload: the FIFO baseline serves in proportion to arrivals",
             (Client("heavy", rate=1600), Client("light", rate=400)),
             policy="fifo", expected={"heavy": 0.8, "light": 0.2}),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda sc: sc.name)
def test_scenario(scenario: Scenario):
    """Each org's share of served work is within the scenario's margin of the expected share."""
    got = scenario.exercise()
    want = scenario.oracle()
    for org in want:
        assert abs(got[org] - want[org]) <= scenario.margin + 1e-9, (org, got, want)
