"""Flow control: which worker has a free slot, and which partition reaches it.

The scheduler decides fairness as late as possible: it emits a batch only
into a free worker slot. This module is the registry of those slots, built
from the workers' :class:`~schemas.messages.WorkerEvent` announcements. Pure:
no Kafka, no clock of its own (every call that needs time takes ``now_ms``,
epoch milliseconds, the clock of the events' ``sent_ms``).

What a worker's slots are
-------------------------

A worker announces its ``slots`` (batches it will hold at once), the
partitions of ``batches.<endpoint>`` it owns, and the batch ids it has in
hand. The scheduler counts as *outstanding* every batch it sent to the
worker and has not seen reported done, plus whatever the worker says it
holds. ``free = slots - outstanding``. A batch counts the moment it is
claimed and sent, not when the worker confirms it, so an event in flight can
never cause over-sending.

Keeping the count honest
------------------------

Three things could make a slot leak, and each is handled:

* **Done elsewhere.** After a rebalance another worker may serve a batch
  sent to a partition that moved. A ``batch_done`` frees the batch wherever
  it is outstanding, whoever reports it.
* **Never fetched.** A batch sent to a partition its worker lost before
  fetching it is never in that worker's hands. A batch outstanding for more
  than ``worker_timeout_ms`` that the worker's latest event (sent after the
  batch) does not list in hand is forgotten (:meth:`FlowControl.expire`
  reports it). A slow batch keeps its slot: the worker lists it in every
  heartbeat.
* **Silent worker.** A worker silent for ``worker_timeout_ms`` (by the
  ``sent_ms`` of its latest event) is lost with its outstanding batches;
  they stay on their partition in Kafka and whoever owns it next serves
  them. ``bye`` removes a worker at once.

Partition ownership follows the newest announcement: a partition two workers
list (during a rebalance) is addressed only through the one whose event is
newer, so it is never reached through two workers; a partition its owner
stops listing is free until someone announces it again.
Events older than ``worker_timeout_ms`` are ignored, so a restarted
scheduler reading old events is not misled by dead workers.

Taking over from another scheduler
----------------------------------

A standby reads the events all along, so when it takes over it already
counts every batch a worker lists in hand as outstanding. What it cannot
see is a batch the old leader wrote that the worker has not fetched yet.
So :meth:`FlowControl.takeover` makes every known worker unusable until an
event it sent after the takeover arrives: by then the worker has fetched
whatever was waiting for it (it fetches whenever it has room, and the old
leader never gave it more than its slots), and that event lists it in hand.
The cost is at most one heartbeat interval per worker on a takeover.

How much each worker holds
--------------------------

``mode="credit"`` (the default): a worker's ``slots`` is a cap, and within
it a worker gets another batch only while its measured credit leaves room
(:mod:`scheduler.credit`: enough work to cover the round trip at its
measured speed behind the batch it runs, within ``max_outstanding_ms``).
Batches a worker lists as ``released`` (it returned their credit, a lead
before their expected end: :mod:`worker.credit_return`)
no longer count against it. ``mode="slots"``: the fixed count of before,
every outstanding batch counting until it is reported done.

Choice of worker: the one with the most free slots (ties: the one sent to
least recently), then its partitions in turn, so batches spread over every
partition a worker owns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from scheduler.credit import Credit
from schemas.messages import WorkerEvent

__all__ = ["Claim", "FlowControl", "LostWorker", "Observed", "WorkerSlots"]

#: How many done batch ids are remembered (a few seconds of batches).
_RECENTLY_DONE = 4096


@dataclass
class WorkerSlots:
    """What the scheduler believes about one worker.

    Fixed at creation: ``worker``, ``endpoint``. Everything else is updated
    by :class:`FlowControl` alone, from events and sends.
    """

    worker: str
    endpoint: str
    slots: int = 0
    partitions: list[int] = field(default_factory=list)
    #: batch id -> when it became outstanding (ms): sent by us or seen in hand.
    outstanding: dict[str, float] = field(default_factory=dict)
    #: ``sent_ms`` of the newest event (clamped to the receiver's clock).
    last_seen_ms: float = 0.0
    #: Batch ids the worker's newest event listed in hand.
    in_hand: frozenset[str] = frozenset()
    #: Of those, the ones whose credit it returned (their end is a lead away).
    released: frozenset[str] = frozenset()
    #: Tokens of the outstanding batches this scheduler sent (by id).
    tokens: dict[str, int] = field(default_factory=dict)
    #: Measured speed and round trip (:mod:`scheduler.credit`).
    credit: Credit = field(default_factory=Credit)
    #: Outstanding batches sent beyond the credit (:meth:`FlowControl.claim`'s ``express``).
    express: set[str] = field(default_factory=set)
    #: Round-robin position in ``partitions``.
    next_partition: int = 0
    #: When we last sent it a batch (ms), for spreading ties.
    last_sent_ms: float = 0.0
    #: No batch goes to it until an event sent after this (ms) arrives (takeover).
    usable_after_ms: float = float("-inf")

    @property
    def usable(self) -> bool:
        return self.last_seen_ms > self.usable_after_ms

    @property
    def free(self) -> int:
        """Slots not taken by an unreleased outstanding batch."""
        # Counted from the few released, not by listing the outstanding (every claim asks).
        outstanding = self.outstanding
        taken = len(outstanding) - sum(1 for b in self.released if b in outstanding)
        return max(0, self.slots - taken)

    def unreleased(self) -> list[str]:
        """Outstanding batches whose credit the worker has not returned yet."""
        released = self.released
        return [b for b in self.outstanding if b not in released]


class Claim(NamedTuple):
    """Where the next batch of an endpoint goes."""

    worker: str
    partition: int


class LostWorker(NamedTuple):
    """A worker that timed out or said bye, and the batches it no longer counts."""

    worker: str
    endpoint: str
    forgotten: list[str]
    reason: str  # "timeout" | "bye"


class Observed(NamedTuple):
    """What one event changed, for the service to log and measure."""

    accepted: bool
    joined: bool = False
    lost: LostWorker | None = None
    #: The batch this event reported done, if it was outstanding anywhere.
    done_batch: str | None = None
    #: That batch was sent beyond the credit (:meth:`FlowControl.claim`'s ``express``).
    express: bool = False


FlowMode = Literal["credit", "slots"]


class FlowControl:
    """The worker-slot registry of every endpoint.

    ``full_batch_tokens`` (endpoint -> max_batch_tokens) sizes a full batch
    for the credit estimates; the service keeps it current on a reload.
    """

    def __init__(self, worker_timeout_ms: float, *, mode: FlowMode = "credit",
                 max_outstanding_ms: float = 500.0,
                 full_batch_tokens: dict[str, int] | None = None):
        self.worker_timeout_ms = worker_timeout_ms
        self.mode: FlowMode = mode
        self.max_outstanding_ms = max_outstanding_ms
        self.full_batch_tokens: dict[str, int] = dict(full_batch_tokens or {})
        self.workers: dict[str, WorkerSlots] = {}
        self._by_endpoint: dict[str, dict[str, WorkerSlots]] = {}
        #: batch id -> worker it is outstanding on.
        self._batch_owner: dict[str, str] = {}
        #: Batches reported done lately: an event that still lists one in hand
        #: (sent just before the report) must not count it again.
        self._recently_done: dict[str, None] = {}
        #: (endpoint, partition) -> (worker, when it announced it): newest wins.
        self._owner: dict[tuple[str, int], tuple[str, float]] = {}

    # -- events ----------------------------------------------------------------

    def observe(self, ev: WorkerEvent, now_ms: float) -> Observed:
        """Apply one worker event; stale events (older than the timeout) are ignored."""
        if ev.sent_ms < now_ms - self.worker_timeout_ms:
            return Observed(accepted=False)
        done, express = None, False
        if ev.kind == "batch_done" and ev.batch_id:
            express = self._measure(ev, now_ms)
            done = self._done_batch(ev.batch_id)
        if ev.kind == "bye":
            w = self.workers.get(ev.worker)
            lost = self._remove(w, "bye") if w is not None else None
            return Observed(accepted=True, lost=lost, done_batch=done, express=express)
        w = self.workers.get(ev.worker)
        joined = w is None
        if w is None:
            w = WorkerSlots(ev.worker, ev.endpoint)
            self.workers[ev.worker] = w
            self._by_endpoint.setdefault(ev.endpoint, {})[ev.worker] = w
        seen = min(float(ev.sent_ms), now_ms)
        if seen < w.last_seen_ms:
            # reordered: keep the newer truth
            return Observed(accepted=False, done_batch=done, express=express)
        w.last_seen_ms = seen
        w.slots = ev.slots
        w.in_hand = frozenset(ev.in_flight)
        # Sticky: a batch whose credit came back stays released until it is done
        # (a later event that leaves it out must not count it against the cap again).
        w.released = frozenset(b for b in (w.released | set(ev.released))
                               if b in w.in_hand or b in w.outstanding)
        for batch_id in ev.in_flight:
            if batch_id not in w.outstanding and batch_id not in self._recently_done:
                self._add(w, batch_id, seen)
        self._set_partitions(w, ev.partitions, seen)
        return Observed(accepted=True, joined=joined, done_batch=done, express=express)

    def _measure(self, ev: WorkerEvent, now_ms: float) -> bool:
        """Feed a ``batch_done`` to the reporting worker's credit (speed, round trip);
        whether the batch was an express one."""
        owner_name = self._batch_owner.get(ev.batch_id, "") if ev.batch_id is not None else ""
        owner = self.workers.get(owner_name)
        express = owner is not None and ev.batch_id in owner.express
        reporter = self.workers.get(ev.worker)
        if reporter is None:
            return express
        round_trip = None
        if owner is not None and ev.batch_id in owner.tokens and ev.held_ms > 0:
            # Our clock from sending to reading the report, less the worker's own time.
            round_trip = now_ms - owner.outstanding[ev.batch_id] - ev.held_ms
        service_ms = ev.service_ms or ev.inference_ms
        # An express batch of a request or two: its call's fixed cost over so few
        # tokens would read as a slower worker and starve it of credit
        # (bench/gpu_feed.py: the model idle 487-607 ms of a burst against
        # 151-232). Its round trip counts; its speed does not, unless it was
        # topped up to half a full batch or more (express_fill).
        full = self.full_batch_tokens.get(reporter.endpoint, 0)
        small = express and (full <= 0 or 2 * ev.batch_tokens < full)
        reporter.credit.observe(tokens=0 if small else ev.batch_tokens,
                                service_ms=service_ms, round_trip_ms=round_trip)
        return express

    def _set_partitions(self, w: WorkerSlots, partitions: list[int], seen: float) -> None:
        parts = sorted(set(partitions))
        ep = w.endpoint
        for p in w.partitions:
            if p not in parts and self._owner.get((ep, p), ("",))[0] == w.worker:
                del self._owner[(ep, p)]
        for p in parts:
            holder = self._owner.get((ep, p))
            if holder is None or holder[0] == w.worker or holder[1] <= seen:
                self._owner[(ep, p)] = (w.worker, seen)
        if parts != w.partitions:
            w.partitions = parts
            w.next_partition = 0

    def owned(self, w: WorkerSlots) -> list[int]:
        """The partitions ``w`` announced that no newer announcement took from it."""
        ep = w.endpoint
        return [p for p in w.partitions if self._owner.get((ep, p), ("",))[0] == w.worker]

    # -- sending ---------------------------------------------------------------

    def free_count(self, w: WorkerSlots) -> int:
        """Batches ``w`` may still take by count (released ones count in ``slots`` mode)."""
        if self.mode == "slots":
            return max(0, w.slots - len(w.outstanding))
        return w.free

    def has_room(self, w: WorkerSlots, *, express: bool = False) -> bool:
        """May one more batch go to ``w`` now (count, then credit)?

        ``express``: the credit aside, while ``w`` has no other express batch
        whose credit it has not returned (``slots`` still caps the count).
        """
        if self.free_count(w) <= 0 or not w.usable:
            return False
        if express:
            w.express.intersection_update(w.outstanding)
            return self.mode == "credit" and not w.express.difference(w.released)
        if self.mode == "slots":
            return True
        return w.credit.room(self._unreleased_tokens(w), cap=w.slots,
                             max_outstanding_ms=self.max_outstanding_ms)

    def _unreleased_tokens(self, w: WorkerSlots) -> Iterator[int]:
        """Tokens of each batch ``w`` has not returned the credit of (a full batch's where
        this scheduler did not send it)."""
        full = self.full_batch_tokens.get(w.endpoint, 0)
        return (w.tokens.get(b, full) for b in w.unreleased())

    def work_ahead_ms(self, w: WorkerSlots) -> float | None:
        """Estimated work ``w`` holds whose credit it has not returned (ms): the batch
        it runs, counted whole until its last call starts, and those queued behind it;
        None until its speed is measured.

        What a batch sent at ``w``'s next credit finds ahead of it, within a lead
        (the batches released end a lead after their credit came back).
        """
        if w.credit.ms_per_token is None:
            return None
        return sum(w.credit.estimate_ms(t) for t in self._unreleased_tokens(w))

    def starts_within(self, endpoint: str, batches: float) -> bool:
        """Would a batch of ``endpoint`` sent at a worker's next credit start within
        ``batches`` full-batch times (``max_batch_tokens`` at that worker's measured
        speed)? True if it would on some usable worker; False while none is measured.
        """
        full = self.full_batch_tokens.get(endpoint, 0)
        for w in self._by_endpoint.get(endpoint, {}).values():
            if not (w.usable and self.owned(w)):
                continue  # no batch goes there: its work ahead is not asked for
            ahead = self.work_ahead_ms(w)
            if ahead is not None and ahead <= batches * w.credit.estimate_ms(full):
                return True
        return False

    def free_workers(self, endpoint: str) -> list[WorkerSlots]:
        """Workers of ``endpoint`` that own a partition and have room for a batch."""
        return [w for w in self._by_endpoint.get(endpoint, {}).values()
                if self.has_room(w) and self.owned(w)]

    def free_slots(self, endpoint: str) -> int:
        return sum(self.free_count(w) for w in self.free_workers(endpoint))

    def claim(self, endpoint: str, *, express: bool = False) -> Claim | None:
        """The worker and partition for ``endpoint``'s next batch, or None if none is free.

        Choosing has no effect until :meth:`sent` confirms a batch went there,
        except that the worker's partition turn advances. ``express``: one
        batch beyond a worker's credit (``mode="credit"`` only), one such
        batch per worker until it returns that one's credit
        (:meth:`has_room`); :meth:`sent` must be told it too.
        """
        best: WorkerSlots | None = None
        best_key = (0, 0.0)
        best_parts: list[int] = []
        for w in self._by_endpoint.get(endpoint, {}).values():
            key = (self.free_count(w), -w.last_sent_ms)
            if (best is not None and key <= best_key) or not self.has_room(w, express=express):
                continue
            parts = self.owned(w)
            if parts:
                best, best_key, best_parts = w, key, parts
        if best is None:
            return None
        i = best.next_partition % len(best_parts)
        best.next_partition = i + 1
        return Claim(best.worker, best_parts[i])

    def sent(self, worker: str, batch_id: str, now_ms: float, tokens: int = 0, *,
             express: bool = False) -> None:
        """Count ``batch_id`` (of ``tokens``) outstanding on ``worker`` from now on."""
        w = self.workers.get(worker)
        if w is None:
            return
        w.last_sent_ms = now_ms
        self._add(w, batch_id, now_ms)
        w.tokens[batch_id] = tokens
        if express:
            w.express.add(batch_id)

    def done(self, batch_id: str) -> str | None:
        """Free ``batch_id``'s slot wherever it is outstanding; returns that worker."""
        return self._done_batch(batch_id)

    def takeover(self, now_ms: float) -> None:
        """A new leader starts: use each known worker only after its next event."""
        for w in self.workers.values():
            w.usable_after_ms = max(w.usable_after_ms, now_ms)

    def forget_unconfirmed(self) -> list[str]:
        """Forget every outstanding batch no worker lists in hand (the broker lost them)."""
        gone = []
        for w in self.workers.values():
            for b in [b for b in w.outstanding if b not in w.in_hand]:
                self._forget(w, b)
                gone.append(b)
        return gone

    # -- time ------------------------------------------------------------------

    def expire(self, now_ms: float) -> list[LostWorker]:
        """Drop silent workers, and batches no worker holds past the timeout.

        A lost worker is reported with reason ``timeout``; forgotten batches
        of live workers are reported under a :class:`LostWorker` with reason
        ``unconfirmed`` (the worker stays).
        """
        out: list[LostWorker] = []
        cutoff = now_ms - self.worker_timeout_ms
        for w in list(self.workers.values()):
            if w.last_seen_ms < cutoff:
                out.append(self._remove(w, "timeout"))
                continue
            stale = [b for b, since in w.outstanding.items()
                     if since < cutoff and b not in w.in_hand and w.last_seen_ms > since]
            for b in stale:
                self._forget(w, b)
            if stale:
                out.append(LostWorker(w.worker, w.endpoint, stale, "unconfirmed"))
        return out

    def next_expiry_ms(self) -> float | None:
        """When :meth:`expire` may next have something to do."""
        # Only what time alone can change: a batch listed in hand, or not yet
        # followed by an event, waits for an event (which wakes the caller).
        times = [w.last_seen_ms for w in self.workers.values()]
        times += [since for w in self.workers.values() for b, since in w.outstanding.items()
                  if b not in w.in_hand and w.last_seen_ms > since]
        return min(times) + self.worker_timeout_ms if times else None

    # -- views -----------------------------------------------------------------

    def round_trip_ms(self, worker: str) -> float | None:
        """``worker``'s measured round trip (ms), None until measured or for an unknown worker."""
        w = self.workers.get(worker)
        return None if w is None else w.credit.round_trip_ms

    def endpoint_workers(self, endpoint: str) -> list[WorkerSlots]:
        return list(self._by_endpoint.get(endpoint, {}).values())

    def outstanding(self, batch_id: str) -> str | None:
        return self._batch_owner.get(batch_id)

    # -- internals -------------------------------------------------------------

    def _add(self, w: WorkerSlots, batch_id: str, since: float) -> None:
        prev = self._batch_owner.get(batch_id)
        if prev is not None and prev != w.worker:
            self._forget(self.workers[prev], batch_id)
        w.outstanding[batch_id] = since
        self._batch_owner[batch_id] = w.worker

    def _forget(self, w: WorkerSlots, batch_id: str) -> None:
        w.outstanding.pop(batch_id, None)
        w.tokens.pop(batch_id, None)
        w.express.discard(batch_id)
        if self._batch_owner.get(batch_id) == w.worker:
            del self._batch_owner[batch_id]

    def _done_batch(self, batch_id: str | None) -> str | None:
        if not batch_id:
            return None
        done = self._recently_done
        done[batch_id] = None
        if len(done) > _RECENTLY_DONE:
            del done[next(iter(done))]
        owner = self._batch_owner.pop(batch_id, None)
        if owner is not None:
            self.workers[owner].outstanding.pop(batch_id, None)
            self.workers[owner].tokens.pop(batch_id, None)
            self.workers[owner].express.discard(batch_id)
        return owner

    def _remove(self, w: WorkerSlots, reason: str) -> LostWorker:
        forgotten = list(w.outstanding)
        for b in forgotten:
            self._forget(w, b)
        for p in w.partitions:
            if self._owner.get((w.endpoint, p), ("",))[0] == w.worker:
                del self._owner[(w.endpoint, p)]
        del self.workers[w.worker]
        eps = self._by_endpoint.get(w.endpoint, {})
        eps.pop(w.worker, None)
        if not eps:
            self._by_endpoint.pop(w.endpoint, None)
        return LostWorker(w.worker, w.endpoint, forgotten, reason)
