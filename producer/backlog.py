"""Admission's backlog: a bursting org's excess held in Kafka, not in the read-ahead.

Why. The read-ahead (:mod:`producer.readahead`) lets a quiet org's record
be decided in the next step whatever shares its partition, and pacing
(:mod:`producer.pacing`) keeps a burst there while the scheduler already
holds a second of it. But the read-ahead is bounded (``read_ahead_records``):
a burst larger than it fills it, admission stops fetching, and every other
org's record waits in the broker until the burst drains (``bench/isolation.py``
measured a quiet org's p99 3.9 s up under 100,000 requests of one org). A
bigger bound only moves the wall: a million requests do not fit in memory.

So once the read-ahead holds ``from_records`` in all, an org with ``after``
records read ahead has every later one written unchanged to the ``backlog``
topic (partition for partition with ingress), several to a record, and read
back from there as it is served; an org with records in the backlog sends
every new one there too, so its order holds. What it had read ahead stays
there, in order, ahead of what it has in the backlog, and is paced as
before: only what arrives past the bound is copied. Below ``from_records``
nothing is copied: a burst the read-ahead holds without nearing its bound is
paced there, and a copy written as a burst arrives is the burst's traffic
twice over on the broker and the cores it shares with every other org
(``docs/load.md``: a quiet org over its bound in every run with the copy,
within in 11 of 26 without). A backlog partition is read while fewer than
``after`` records of the orgs it holds wait in the read-ahead (those read
back and those read ahead from ingress), so a burst is not read back while
its first records still wait. What waits behind a burst in the backlog is
only other bursting orgs of the same partition; the ingress keeps flowing.

The promises hold: a spilled record's ingress offset is released only once
the broker has its backlog copy, and a backlog record's only once every
record in it is decided and written (a crash replays it, as it replays
ingress); the records keep their key, value, headers and timestamp. The
ingress partition is committed past the spilled records once the broker has
their copies, not past the records still read ahead: a restart reads those
from ingress again, as it reads any undecided record.

Pure: the wire form of a backlog record (:func:`encode`, :func:`decode`) and
the routing rule (:class:`Backlog`); the service does the I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import msgspec

__all__ = ["BACKLOG_HEADER", "KEEP", "RECORD_ITEMS", "SPILL", "BackRecord", "Backlog", "decode",
           "encode", "item_bytes"]

#: Ingress records in one backlog record at most. Its offset is committed once every
#: one of them is decided, so a restart admits again at most this many already
#: decided records of a partition (as ingress replays those decided past its oldest
#: undecided one); against that, one record per hundred requests is little to write.
RECORD_ITEMS = 100

#: :meth:`Backlog.route`'s answers.
KEEP, SPILL = 0, 1

#: The header every backlog record carries: what it is, and its version.
BACKLOG_HEADER = ("sf-backlog", b"1")


class _Item(msgspec.Struct, array_like=True):
    """One ingress record as the backlog keeps it."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[_Item])


class BackRecord:
    """An ingress record read back from the backlog: what admission reads of a consumer
    record (``key``, ``value``, ``headers``, ``timestamp``), and where its backlog copy is
    (``topic``, ``partition``, ``offset``: the backlog record, shared by the records in it)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, topic: str, partition: int, offset: int, item: _Item) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.key, self.value = item.key, item.value
        self.headers = tuple(item.headers)
        self.timestamp = item.timestamp


def item_bytes(rec: Any) -> int:
    """About what ``rec`` takes in a backlog record (for :func:`schemas.packs.split`)."""
    return (len(rec.value or b"") + len(rec.key or b"") + 16
            + sum(len(k) + len(v) + 4 for k, v in rec.headers))


def encode(records: Sequence[Any]) -> bytes:
    """Consumer records (``key``, ``value``, ``headers``, ``timestamp``) as one backlog value."""
    return _encoder.encode([_Item(r.key, bytes(r.value or b""), list(r.headers), r.timestamp)
                            for r in records])


def decode(topic: str, partition: int, offset: int, value: bytes | None,
           headers: Iterable[tuple[str, bytes]]) -> list[BackRecord]:
    """The records of one backlog record; ``ValueError`` naming what is wrong with it."""
    version = dict(headers).get(BACKLOG_HEADER[0])
    if version != BACKLOG_HEADER[1]:
        raise ValueError(f"not a backlog record of version 1 ({BACKLOG_HEADER[0]}: {version!r})")
    try:
        items = _decoder.decode(value or b"")
    except msgspec.DecodeError as e:
        raise ValueError(f"undecodable backlog record: {e}") from e
    return [BackRecord(topic, partition, offset, it) for it in items]


class Backlog:
    """Which fetched ingress records go to the backlog, per (partition, key).

    ``after``: a record goes there once its (partition, key) has this many
    records read ahead while the read-ahead is pressed (holds
    ``from_records`` in all), and while any of that key's records are there;
    0 never. Counts are this instance's, since its last assignment.
    """

    def __init__(self, after: int, from_records: int = 0) -> None:
        self.after = after
        self.from_records = from_records
        #: (partition, key) -> records written to the backlog and not yet read back.
        self._out: dict[tuple[Hashable, Any], int] = {}

    def __len__(self) -> int:
        """(partition, key) pairs with records in the backlog."""
        return len(self._out)

    def route(self, partition: Hashable, key: Any, held: int, read_ahead: int) -> int:
        """Where the next ingress record of ``key`` goes, ``held`` of its records and
        ``read_ahead`` in all being read ahead: :data:`KEEP` (read ahead) or
        :data:`SPILL` (to the backlog, behind its records there). What goes is counted
        out."""
        if self.after <= 0:
            return KEEP
        k = (partition, key)
        out = self._out.get(k, 0)
        if out > 0:
            self._out[k] = out + 1
            return SPILL
        if held < self.after or read_ahead < self.from_records:
            return KEEP
        self._out[k] = 1
        return SPILL

    def read_back(self, partition: Hashable, key: Any) -> None:
        """One record of ``key`` came back (one a former owner wrote is not counted)."""
        k = (partition, key)
        out = self._out.get(k, 0)
        if out > 1:
            self._out[k] = out - 1
        elif out == 1:
            del self._out[k]

    def out(self, partition: Hashable, key: Any) -> int:
        """Records of ``key`` in the backlog, as this instance counts them."""
        return self._out.get((partition, key), 0)

    def spilled(self) -> list[tuple[Hashable, Any]]:
        """The (partition, key) pairs with records in the backlog."""
        return list(self._out)

    def clear(self) -> None:
        """A new assignment: what was counted is the former generation's."""
        self._out.clear()
