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


@dataclass(eq=False)
class Dispatcher:
    """Turns credit into batches. ``epoch`` is set by the service on each takeover."""

    core: Scheduler
    flow: FlowControl
    backlog: Backlog
    _: KW_ONLY
    instance: str
    watch: Any = None
    epoch: int = field(default=0, init=False)
    _seq: int = field(default=0, init=False)
    #: Tokens of recently sent batches, by id (bounded), for in_flight_tokens.
    sent_tokens: dict[str, int] = field(default_factory=dict, init=False)

    def batches(self, now: float, *, may: Callable[[], bool],
                on_expired: Callable[[list[Entry]], None]) -> Iterator[Outgoing]:
        """Each batch the workers' credit allows now, lane by lane, while ``may()`` holds."""
        for endpoint in self.core.endpoints:
            while self.core.held_in(endpoint) > 0 and may():
                claim = self.flow.claim(endpoint)
                if claim is None:
                    break
                if self.watch is not None:
                    self.watch.held(now, endpoint, self.backlog)
                d = self.core.next_batch(endpoint, now, in_run_order=True)
                if d.expired:
                    on_expired(d.expired)
                if not d.batch:
                    break
                yield self._out(now, endpoint, claim.worker, claim.partition, d.batch)

    def _out(self, now: float, endpoint: str, worker: str, partition: int,
             entries: list[Entry]) -> Outgoing:
        self._seq += 1
        batch = Batch(id=f"{self.instance}-{self._seq}", endpoint=endpoint,
                      requests=[e.payload for e in entries],
                      tokens=sum(e.tokens for e in entries), created_ms=int(now * 1000),
                      worker=worker, epoch=self.epoch,
                      round_trip_ms=self.flow.round_trip_ms(worker))
        self.flow.sent(worker, batch.id, now * 1000, batch.tokens)
        self.sent_tokens[batch.id] = batch.tokens
        if len(self.sent_tokens) > _SENT_TOKENS_KEPT:
            del self.sent_tokens[next(iter(self.sent_tokens))]
        for e in entries:
            self.backlog.remove(endpoint, e.tier, e.org, e.tokens)
        if self.watch is not None:
            self.watch.served(now, endpoint, entries,
                              lambda e, ep=endpoint: self.core.cost(ep, e), self.backlog)
        return Outgoing(endpoint, partition, batch, entries)

    def in_flight_tokens(self, endpoint: str, full_batch_tokens: int) -> int:
        """Tokens of the batches outstanding at ``endpoint``'s workers (the throttle's due).

        A batch this instance did not send (taken over from the previous
        leader) counts as a full batch.
        """
        return sum(self.sent_tokens.get(batch_id, full_batch_tokens)
                   for w in self.flow.endpoint_workers(endpoint) for batch_id in w.outstanding)
