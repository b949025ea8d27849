"""Admission's read-ahead: fetched ingress records, decided one org at a time in turn.

Ingress is keyed by org, so a burst fills one partition, and an org whose
key hashes to the same partition finds its records behind the whole burst
in the log. Deciding records in log order made that org wait for every
burst record before it (seconds, growing with the burst); deciding whole
fetches made every other org wait for a fetch of the burst.

So admission reads ahead, up to a bound, and decides from what it holds in
turns: each step takes one record of each (partition, key) group in turn,
each group in its own order, until the step is full. An org's records keep
their order (they share a key, hence a group); a quiet org's record is
decided in the first step after it was fetched, whatever shares its
partition. Offsets are committed in log order regardless
(:class:`plumbing.offsets.OffsetTracker`), so a crash replays whatever was
not yet decided and written.

Pure: no Kafka, no clock. Records are any objects with ``key`` (bytes or
None); the partition is given with them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any, Protocol

__all__ = ["Allowance", "ReadAhead"]


class Allowance(Protocol):
    """Per key, whether a record may be taken now and when the next one may
    (:class:`producer.shaping.Shaper`, :class:`producer.pacing.Pacer`)."""

    def take(self, key: Hashable, now: float) -> bool: ...

    def due_in(self, key: Hashable, now: float) -> float: ...


class ReadAhead:
    """Fetched, undecided records, grouped by (partition, key), taken in turns.

    ``held`` counts what it holds; the service stops fetching while it is at
    its bound. Groups are served round-robin in the order they first had
    work; a group that empties leaves the ring and rejoins at its end.
    """

    def __init__(self) -> None:
        #: (partition, key) -> (record, fetched at, its own partition), in order.
        self._groups: dict[tuple[Hashable, Any], deque[tuple[Any, Any, Hashable]]] = {}
        self._ring: deque[tuple[Hashable, Any]] = deque()
        self.held = 0

    def __len__(self) -> int:
        return self.held

    def add(self, partition: Hashable, records: Iterable[Any], at: Any = None, *,
            group: Hashable | None = None) -> None:
        """Hold ``records`` of ``partition``, in their order; ``at``: when they were fetched.

        ``group``: the partition whose (partition, key) groups they join, when not
        their own (records read back from admission's backlog join their ingress
        partition's, behind what their org has there); :meth:`take` still names
        ``partition``."""
        groups = self._groups
        home = partition if group is None else group
        for rec in records:
            g = (home, rec.key)
            q = groups.get(g)
            if q is None:
                q = groups[g] = deque()
                self._ring.append(g)
            q.append((rec, at, partition))
            self.held += 1

    def count(self, partition: Hashable, key: Any) -> int:
        """Records held in the (``partition``, ``key``) group."""
        q = self._groups.get((partition, key))
        return 0 if q is None else len(q)

    def take(self, n: int, max_bytes: int | None = None, *, shaper: Allowance | None = None,
             now: float = 0.0) -> list[tuple[Hashable, Any, Any]]:
        """Up to ``n`` (partition, record, fetched at): one per group in turn, each in order.

        ``max_bytes``: stop once the records taken hold this many bytes of
        value (at least one record is taken). ``shaper``: a keyed group is
        passed over while its key has no allowance at ``now`` (it keeps its
        place in the turn), and each record taken spends one
        (:mod:`producer.shaping`); unkeyed records are not shaped.
        """
        out: list[tuple[Hashable, Any, Any]] = []
        ring, groups = self._ring, self._groups
        size = 0
        budget = float("inf") if max_bytes is None else max_bytes
        while len(out) < n and ring and size < budget:
            # One pass over the ring as it stands: one record of each group.
            taken = len(out)
            for _ in range(len(ring)):
                if len(out) >= n or size >= budget:
                    break
                g = ring.popleft()
                if shaper is not None and g[1] is not None and not shaper.take(g[1], now):
                    ring.append(g)
                    continue
                q = groups[g]
                rec, at, partition = q.popleft()
                size += len(rec.value or b"")
                out.append((partition, rec, at))
                if q:
                    ring.append(g)
                else:
                    del groups[g]
            if len(out) == taken:
                break  # every group left is waiting for its allowance
        self.held -= len(out)
        return out

    def due_in(self, shaper: Allowance | None, now: float) -> float | None:
        """Seconds until :meth:`take` with ``shaper`` would return a record: 0 if it would
        now, None if nothing is held."""
        if not self._ring:
            return None
        if shaper is None:
            return 0.0
        soonest = float("inf")
        for _, key in self._ring:  # in turn order: the next group is usually ready
            due = 0.0 if key is None else shaper.due_in(key, now)
            if due == 0.0:
                return 0.0
            soonest = min(soonest, due)
        return soonest

    def drop(self, partitions: Iterable[Hashable] | None = None) -> int:
        """Forget what is held of ``partitions`` (all when None); returns how many records."""
        if partitions is None:
            dropped, self.held = self.held, 0
            self._groups.clear()
            self._ring.clear()
            return dropped
        gone = set(partitions)
        dropped = 0
        for g in [g for g in self._groups if g[0] in gone]:
            dropped += len(self._groups.pop(g))
        self._ring = deque(g for g in self._ring if g in self._groups)
        self.held -= dropped
        return dropped
