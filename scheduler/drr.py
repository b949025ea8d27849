"""Deficit Round Robin across the orgs of one tier, with a priority heap per org.

The ring holds the orgs that have work. The org at the head has the turn: on
taking it, its deficit grows by ``quantum x weight``; it is served while its
deficit covers the cost of its first request; when it does not, the turn
passes (the org moves to the back, keeping its deficit). An org whose queue
empties leaves the ring and its deficit drops to zero: no banked credit.

Because configuration guarantees ``quantum x weight >= largest request
cost``, a fresh turn always covers the first request, so a selection looks
at most at two orgs: O(1) in the number of orgs. Inside an org, requests wait
in a binary heap ordered by (priority desc, deadline asc, arrival asc, then
push order):
O(log n) in that org's queue.

Expired requests are removed lazily: the lane marks them, the org's live
count drops at once (and with it the deficit when it reaches zero), and the
heap discards them when they surface.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush

from scheduler.entry import HELD, Entry

__all__ = ["DrrTier", "OrgQueue"]


class OrgQueue:
    """One org's queue in one tier.

    ``weight`` may be changed by a reconfiguration (it applies from the
    org's next turn); everything else is the ring's to change.
    """

    __slots__ = ("deficit", "heap", "in_ring", "in_turn", "live", "org", "weight")

    def __init__(self, org: str, weight: float):
        self.org = org
        self.weight = weight
        self.heap: list[tuple[int, float, float, int, Entry]] = []
        self.live = 0
        self.deficit = 0.0
        self.in_turn = False
        self.in_ring = False

    def top(self) -> Entry | None:
        heap = self.heap
        while heap:
            e = heap[0][4]
            if e.state == HELD:
                return e
            heappop(heap)
        return None


class DrrTier:
    """The DRR ring of one tier of one endpoint lane."""

    __slots__ = ("fresh", "live", "orgs", "quantum", "ring", "rounds", "weight_of")

    def __init__(self, quantum: float, weight_of: Callable[[str], float]):
        self.quantum = quantum
        self.weight_of = weight_of
        self.ring: deque[OrgQueue] = deque()
        self.orgs: dict[str, OrgQueue] = {}
        self.live = 0
        #: Turns granted so far (a "DRR round" per org visit), for metrics.
        self.rounds = 0
        #: Orgs that joined the ring with nothing held and were not served since,
        #: by name, in the order they came (:meth:`peek_fresh`).
        self.fresh: dict[str, OrgQueue] = {}

    def push(self, e: Entry) -> None:
        q = self.orgs.get(e.org)
        if q is None:
            q = self.orgs[e.org] = OrgQueue(e.org, self.weight_of(e.org))
        heappush(q.heap, (-e.priority, e.deadline, e.arrival, e.seq, e))
        q.live += 1
        self.live += 1
        if not q.in_ring:
            q.in_ring = True
            q.deficit = 0.0
            q.in_turn = False
            self.ring.append(q)
            self.fresh[q.org] = q

    def peek(self, cost: Callable[[Entry], float]) -> tuple[OrgQueue, Entry, float] | None:
        """The next request by DRR, without removing it.

        Granting a turn's quantum is a side effect, done once per turn, so
        peeking again (a batch closed on this request) changes nothing.
        """
        ring = self.ring
        while ring:
            q = ring[0]
            e = q.top()
            if e is None:
                self._leave(q)
                continue
            if not q.in_turn:
                q.in_turn = True
                q.deficit += self.quantum * q.weight
                self.rounds += 1
            c = cost(e)
            if c <= q.deficit:
                return q, e, c
            q.in_turn = False
            ring.rotate(-1)
        return None

    def take(self, q: OrgQueue, e: Entry, c: float) -> None:
        """Remove ``e`` (just returned by :meth:`peek` or :meth:`peek_fresh`) and charge its cost."""
        heappop(q.heap)
        q.deficit -= c
        q.live -= 1
        self.live -= 1
        self.fresh.pop(q.org, None)
        if q.live == 0:
            self._leave(q)

    def peek_fresh(self, cost: Callable[[Entry], float]) -> tuple[OrgQueue, Entry, float] | None:
        """The first request of the first org still fresh (None: none), for an express batch.

        An org is fresh from the moment it joins the ring with nothing held
        until it is first served: the quiet org under a burst, whose request
        should not wait for the batch already queued at the worker. Taking
        it (:meth:`take`, as any pick) charges its cost to the org's deficit, so
        the org's next turns in the ring give that much less: ahead of its
        turn, not beyond its share.
        """
        for q in list(self.fresh.values()):
            e = q.top()
            if e is not None:
                return q, e, cost(e)
            del self.fresh[q.org]  # its requests expired: it waits for new ones like any org
        return None

    def discard(self, e: Entry) -> None:
        """Account for ``e`` having expired; its heap slot is dropped lazily."""
        q = self.orgs[e.org]
        q.live -= 1
        self.live -= 1
        if q.live == 0:
            self.fresh.pop(q.org, None)
            if self.ring and self.ring[0] is q:
                # It had the turn: leave now, or a push before the next peek
                # would find it still at the head and grant it a second turn.
                self._leave(q)
            else:
                q.deficit = 0.0
                q.in_turn = False

    def _leave(self, q: OrgQueue) -> None:
        # The ring's head, but for an org emptied by an express take (peek_fresh),
        # which may stand anywhere in it.
        if self.ring[0] is q:
            self.ring.popleft()
        else:
            self.ring.remove(q)
        self.fresh.pop(q.org, None)
        q.in_ring = False
        q.in_turn = False
        q.deficit = 0.0
        if q.live == 0:
            q.heap.clear()
            del self.orgs[q.org]

    def reweigh(self) -> None:
        for q in self.orgs.values():
            q.weight = self.weight_of(q.org)
