"""Dispatch: the next batch of each lane, for a worker with credit, now.

The fairness decision is made here, as late as possible: only when flow
control (:mod:`scheduler.flow`) has a worker with credit does the core
(:mod:`scheduler.core`) choose a batch, in run order, and only then is it
counted outstanding on that worker. :class:`Dispatcher` yields what to
write, one batch at a time, and the service writes each before asking for
the next (leadership can go while a write awaits, so the service re-checks
it between batches).

Pure: no Kafka, no clock of its own (``now`` is an argument), no metrics;
the live fairness watch is whatever object the service passes (its
``held``/``served`` see every decision).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NamedTuple

from scheduler.core import Scheduler
from scheduler.entry import Entry
from scheduler.flow import FlowControl
from scheduler.snapshot import Backlog
from schemas.messages import Batch

__all__ = ["Dispatcher", "Outgoing"]

#: Batch sizes remembered for the in-flight count: far more than are ever outstanding.
_SENT_TOKENS_KEPT = 4096


class Outgoing(NamedTuple):
    """A batch to write: where to, and the held entries it carries."""

    endpoint: str
    partition: int
    batch: Batch
    entries: list[Entry]
    #: What the batch charged, per org: ``(tier, org, requests, cost)``, cost in the
    #: lane's units as the core charged it.
    charges: list[tuple[str, str, int, float]]


@dataclass(eq=False)
class Dispatcher:
    """Turns credit into batches. ``epoch`` is set by the service on each takeover."""

    core: Scheduler
    flow: FlowControl
    backlog: Backlog
    _: KW_ONLY
    instance: str
    watch: Any = None
    #: Send an express batch (:meth:`batches`) when an org with nothing held comes in.
    express: bool = True
    #: Top an express batch up in DRR order to this share of the endpoint's
    #: ``max_batch_tokens`` once the fresh orgs' requests are in it (0: nothing more).
    express_fill: float = 0.0
    #: No express batch while a batch sent at a worker's next credit would start within
    #: this many full-batch times (:meth:`FlowControl.starts_within`): the fresh
    #: requests go first in that regular batch instead. 0 (the default): an express
    #: batch whenever the credit is spent, and regular batches in DRR's order.
    express_horizon: float = 0.0
    epoch: int = field(default=0, init=False)
    _seq: int = field(default=0, init=False)
    #: Tokens of recently sent batches, by id (bounded), for in_flight_tokens.
    sent_tokens: dict[str, int] = field(default_factory=dict, init=False)

    def batches(self, now: float, *, may: Callable[[], bool],
                on_expired: Callable[[list[Entry]], None]) -> Iterator[Outgoing]:
        """Each batch the workers' credit allows now, lane by lane, while ``may()`` holds.

        And *express* batches beyond it: when the credit is spent and an org
        that came in with nothing held waits unserved (a quiet org under a
        burst: :meth:`scheduler.core.Scheduler.has_fresh`), a batch of one
        request of each such org goes out at once, and the worker runs it
        ahead of the batches it holds (:mod:`worker.model_thread`'s urgent
        calls). Without it the quiet request waits for the batch already
        queued at the worker, sent a lead before the running one ends, and
        then for its own full batch: two batches and a lead. With it, for
        the call in progress and its own short call. Its cost is charged to
        the org's DRR deficit (ahead of its turn, not beyond its share) and
        it counts against the worker's credit like any batch; at most one
        per worker until the worker returns its credit (as it starts it),
        within its ``slots`` (:meth:`FlowControl.claim`). By default it
        carries the fresh requests alone, and the worker runs them in the
        call waiting next where that has room (one call's fixed cost for
        both: :class:`worker.model_thread.Joinable`). Behind them it may be
        topped up in DRR order to ``express_fill`` of a full batch's tokens:
        the worker then runs the fresh requests first
        (:func:`worker.microbatch.plan_with_head`), the top-up after, and
        the head is mostly too big to join. A full top-up makes it take the
        place of the next regular batch, but a full batch returns its credit
        later and the next quiet org waits for it (``docs/load.md``, "An
        express call that rides the next one", "Express batches as full
        batches").
        """
        for endpoint in self.core.endpoints:
            while self.core.held_in(endpoint) > 0 and may():
                express = fresh = False
                claim = self.flow.claim(endpoint)
                horizon = self.express_horizon
                if (self.express and (claim is None or horizon > 0)
                        and self.core.has_fresh(endpoint)):
                    if claim is not None:
                        # A regular batch, the fresh orgs' requests first: they may have
                        # been kept from an express batch for it.
                        fresh = True
                    elif not (horizon > 0 and self.flow.starts_within(endpoint, horizon)):
                        claim = self.flow.claim(endpoint, express=True)
                        express = fresh = claim is not None
                if claim is None:
                    break
                if self.watch is not None:
                    self.watch.held(now, endpoint, self.backlog)
                d = self.core.next_batch(endpoint, now, in_run_order=True, fresh=fresh,
                                         fill=self.express_fill if express else 1.0)
                if d.expired:
                    on_expired(d.expired)
                if not d.batch:
                    break
                yield self._out(now, endpoint, claim.worker, claim.partition, d.batch,
                                express=express)

    def _out(self, now: float, endpoint: str, worker: str, partition: int,
             entries: list[Entry], *, express: bool = False) -> Outgoing:
        self._seq += 1
        batch = Batch(id=f"{self.instance}-{self._seq}", endpoint=endpoint,
                      requests=[e.payload for e in entries],
                      tokens=sum(e.tokens for e in entries), created_ms=int(now * 1000),
                      worker=worker, epoch=self.epoch,
                      round_trip_ms=self.flow.round_trip_ms(worker), express=express)
        self.flow.sent(worker, batch.id, now * 1000, batch.tokens, express=express)
        self.sent_tokens[batch.id] = batch.tokens
        if len(self.sent_tokens) > _SENT_TOKENS_KEPT:
            del self.sent_tokens[next(iter(self.sent_tokens))]
        cost = self.core.cost_of(endpoint)
        per_org: dict[tuple[str, str], list] = {}
        for e in entries:
            c = per_org.get(key := (e.tier, e.org))
            if c is None:
                per_org[key] = [1, e.tokens, cost(e)]
            else:
                c[0] += 1
                c[1] += e.tokens
                c[2] += cost(e)
        for (tier, org), (n, tokens, _) in per_org.items():
            self.backlog.remove(endpoint, tier, org, tokens, n)
        charges = [(tier, org, n, c) for (tier, org), (n, _, c) in per_org.items()]
        if self.watch is not None:
            self.watch.charged(now, endpoint, [(t, o, c) for t, o, _, c in charges],
                               self.backlog)
        return Outgoing(endpoint, partition, batch, entries, charges)

    def in_flight_tokens(self, endpoint: str, full_batch_tokens: int) -> int:
        """Tokens of the batches outstanding at ``endpoint``'s workers (the throttle's due).

        A batch this instance did not send (taken over from the previous
        leader) counts as a full batch.
        """
        return sum(self.sent_tokens.get(batch_id, full_batch_tokens)
                   for w in self.flow.endpoint_workers(endpoint) for batch_id in w.outstanding)
