"""Which offset of each partition is safe to commit.

A service that holds records in memory may commit a partition only up to
the oldest record it still holds: committing past it would lose that record
if the process died. The scheduler holds admitted requests until their
batch (or ``expired`` result) is acknowledged by the broker; the worker
holds a batch until its results are written. Both release records out of
order (a later request may be dispatched first), so "the oldest held" is a
min-heap of offsets with lazy deletion: hold and release are O(log n)
amortised, :meth:`OffsetTracker.committable` O(1) amortised.

Pure: keys are any hashable partition identifiers (aiokafka's
``TopicPartition``, or a plain tuple in tests).
"""

from __future__ import annotations

from collections.abc import Hashable
from heapq import heappop, heappush

__all__ = ["OffsetTracker"]


class _Partition:
    __slots__ = ("committed", "heap", "held", "next")

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # offset -> times held (normally 1)
        self.heap: list[int] = []
        self.next: int | None = None  # last consumed + 1
        self.committed: int | None = None


class OffsetTracker:
    """Per partition: consumed position, held offsets, and what may be committed."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition] = {}

    def consumed(self, tp: Hashable, offset: int) -> None:
        """Record that ``offset`` of ``tp`` has been read (held or not)."""
        p = self._parts.get(tp)
        if p is None:
            p = self._parts[tp] = _Partition()
        if p.next is None or offset + 1 > p.next:
            p.next = offset + 1

    def hold(self, tp: Hashable, offset: int, times: int = 1) -> None:
        """Keep ``offset`` of ``tp`` uncommitted until it is released as many ``times``
        (a record of several requests is held once for each)."""
        p = self._parts.get(tp)
        if p is None:
            p = self._parts[tp] = _Partition()
        n = p.held.get(offset, 0)
        p.held[offset] = n + times
        if n == 0:
            heappush(p.heap, offset)
        if p.next is None or offset + 1 > p.next:
            p.next = offset + 1

    def release(self, tp: Hashable, offset: int, times: int = 1) -> None:
        """``offset`` of ``tp`` is done ``times`` over; unknown partitions and offsets are
        ignored, and a release beyond its holds drops the offset (never below zero)."""
        p = self._parts.get(tp)
        if p is None:
            return
        n = p.held.get(offset)
        if n is None:
            return
        if n > times:
            p.held[offset] = n - times
        else:
            del p.held[offset]  # its heap slot is dropped lazily

    def holds(self, tp: Hashable, offset: int) -> bool:
        """True while ``offset`` of ``tp`` is held (by one hold or more)."""
        p = self._parts.get(tp)
        return p is not None and offset in p.held

    def position(self, tp: Hashable) -> int | None:
        """Last consumed offset + 1 (None before the first record)."""
        p = self._parts.get(tp)
        return p.next if p is not None else None

    def held(self, tp: Hashable) -> int:
        p = self._parts.get(tp)
        return len(p.held) if p is not None else 0

    def committable(self, tp: Hashable) -> int | None:
        """The offset to commit for ``tp``: the oldest held, else last consumed + 1.

        None when nothing of ``tp`` was consumed yet.
        """
        p = self._parts.get(tp)
        if p is None:
            return None
        heap, held = p.heap, p.held
        while heap and heap[0] not in held:
            heappop(heap)
        return heap[0] if heap else p.next

    def to_commit(self) -> dict[Hashable, int]:
        """Partitions whose committable offset moved since :meth:`committed` last said so."""
        out = {}
        for tp, p in self._parts.items():
            c = self.committable(tp)
            if c is not None and c != p.committed:
                out[tp] = c
        return out

    def committed(self, offsets: dict[Hashable, int]) -> None:
        """Remember what the broker acknowledged, so it is not committed again."""
        for tp, offset in offsets.items():
            p = self._parts.get(tp)
            if p is not None:
                p.committed = offset

    def forget(self, tp: Hashable) -> None:
        """Drop ``tp`` (revoked): its offsets are another consumer's business now."""
        self._parts.pop(tp, None)

    def partitions(self) -> list[Hashable]:
        return list(self._parts)
