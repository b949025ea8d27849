"""Hold back a fetch that jumps past offsets the broker has not made readable yet.

Offsets in a partition are contiguous unless records were compacted away or
a transaction marker sits between them; the pipeline writes neither, so a
fetch whose records start beyond the consumer's position means the broker
answered past a write it had acknowledged and not yet stored. Tansu does
that: its produce reserves the offsets (the high watermark moves) and then
stores the batch, and its fetch lists the stored batches at or above the
fetch offset below the high watermark; a fetch between a produce's two steps,
after a later produce has stored its batch, returns that later batch.
aiokafka takes records beyond its position as compaction and moves on, so
the earlier batch is never read: an acknowledged request admission never
decides, results the client never sees (docs/reliability.md, 4 of 31
overload runs).

:class:`Contiguity` decides, per partition, what a fetch may hand on: the
records up to the first jump, and where to fetch again from. A jump that is
still there after ``grace_s`` is a real gap (a foreign transactional
producer's markers, compaction on a real cluster) and is let through, once,
with the span it skipped. Pure: no Kafka, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["Contiguity", "Cut", "Gap"]


class _Record(Protocol):
    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=_Record)


@dataclass(frozen=True, slots=True)
class Gap:
    """Offsets ``[start, end)`` a fetch jumped over, and for how long it has."""

    start: int
    end: int
    waited_s: float


@dataclass(frozen=True, slots=True)
class Cut(Generic[R]):
    """What one partition's fetch may hand on.

    ``kept`` are the records to deliver; ``refetch_from`` is set when the rest
    was held back (seek there and fetch again); ``skipped`` lists the gaps
    that outlived the grace and were let through.
    """

    kept: Sequence[R]
    refetch_from: int | None = None
    skipped: tuple[Gap, ...] = ()


class Contiguity:
    """Per partition, the first time each jump was seen; a jump at most ``grace_s`` old is held."""

    def __init__(self, grace_s: float = 0.5) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.grace_s = grace_s
        self._since: dict[Hashable, tuple[int, float]] = {}

    def cut(self, tp: Hashable, expected: int | None, records: Sequence[R], now: float) -> Cut[R]:
        """Split ``records`` (one partition's, in fetch order) at the first young jump.

        ``expected`` is the position the fetch started from (``None`` when
        unknown: only jumps inside ``records`` count).
        """
        if not records:
            return Cut(records)
        first, last = records[0].offset, records[-1].offset
        if (expected is None or first == expected) and last - first == len(records) - 1:
            # Offsets rise strictly, so this span holds no jump: the usual case, in O(1).
            if tp in self._since:
                del self._since[tp]
            return Cut(records)
        want = expected
        skipped: list[Gap] = []
        for i, rec in enumerate(records):
            offset = rec.offset
            if want is not None and offset > want:
                seen = self._since.get(tp)
                if seen is None or seen[0] != want:
                    seen = (want, now)
                    self._since[tp] = seen
                waited = now - seen[1]
                if waited < self.grace_s:
                    return Cut(records[:i], refetch_from=want, skipped=tuple(skipped))
                skipped.append(Gap(want, offset, waited))
                self._since.pop(tp, None)
            want = offset + 1
        if tp in self._since and want is not None and self._since[tp][0] < want:
            del self._since[tp]
        return Cut(records, skipped=tuple(skipped))
