"""Writing many records at once: filled record batches per topic partition, one wait.

``producer.send()`` costs a partitioner call, an accumulator append and a
future per record (9-15 us here); for a service that writes hundreds of
records per step (admission's decisions, a worker's results) that was a
large share of its own CPU time. :class:`Outbox` appends a step's records
to aiokafka :class:`~aiokafka.producer.message_accumulator.BatchBuilder`\\ s
(aiokafka's C record builder), one per topic partition, and hands each
builder to the producer with ``send_batch``: about 1-3 us per record.

A topic partition has at most one of our builders at the producer and not
yet acknowledged. Records for it that come meanwhile fill the next builder,
which is handed over the moment the one in flight is acknowledged, so small
steps (a worker's micro-batch of results) coalesce into full batches
instead of queueing one small produce request each behind the last.

Keys pick partitions as aiokafka's default partitioner does (murmur2 of the
key over the topic's partitions), so a record written here lands where
``send(key=...)`` would have put it: an org's requests stay on one
partition whichever way they were written. A record without key or
partition goes to the topic's partitions in turn.

Failures are per builder, reported per record: a caller retries or
dead-letters what failed, one record at a time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from aiokafka.partitioner import murmur2

__all__ = ["Outbox", "Written", "partition_for_key"]

Headers = Sequence[tuple[str, bytes]]

#: Keys whose hash is remembered (orgs): a bound, not a target.
_HASH_CACHE = 65_536


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition aiokafka's default partitioner gives ``key`` among ``partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class _Open:
    """One builder of one topic partition: filled, then handed to the producer once."""

    __slots__ = ("builder", "done", "records")

    def __init__(self, builder: Any) -> None:  # aiokafka's BatchBuilder (untyped)
        self.builder = builder
        self.records = 0
        #: None once the broker acknowledged the builder's records, else the error.
        self.done: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())


class Outbox:
    """Records written with filled batches per topic partition.

    Not thread-safe; one outbox per producer, shared by a service's tasks.
    ``add`` queues a record; ``submit`` hands everything queued to the
    builders and returns a :class:`Written` whose ``outcomes`` says, per
    record in the order added, ``None`` once acknowledged or the error.
    Records of a later submit reach a partition after those of an earlier one.
    """

    def __init__(self, producer, *, hash_keys: bool = True):
        self.producer = producer
        #: False: keyed records go to partitions in turn too (results: any
        #: partition serves a reader that reads them all, and hashing every
        #: request id costs more than writing it).
        self.hash_keys = hash_keys
        self._records: list[tuple[str, int | None, bytes | None, bytes | None, Headers]] = []
        self._hashes: dict[bytes, int] = {}
        self._turn = itertools.count()
        #: (topic, partition) -> the builder being filled (not handed over yet).
        self._open: dict[tuple[str, int], _Open] = {}
        #: (topic, partition) -> the newest builder, filling or in flight.
        self._tail: dict[tuple[str, int], _Open] = {}
        self._ships: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, topic: str, value: bytes | None, *, key: bytes | None = None,
            partition: int | None = None, headers: Headers = ()) -> None:
        """Queue one record for the next :meth:`submit`."""
        self._records.append((topic, partition, key, value, headers))

    async def flush(self) -> list[BaseException | None]:
        """Submit every queued record and wait for the broker; per record: None or the error."""
        return await (await self.submit()).outcomes()

    async def submit(self) -> Written:
        """Put every queued record into a builder; returns before the broker answers."""
        records, self._records = self._records, []
        counts: dict[str, int | BaseException] = {}
        for topic in {r[0] for r in records if r[1] is None}:
            try:
                counts[topic] = len(await self.producer.partitions_for(topic))
            except Exception as e:  # noqa: BLE001 - reported per record
                counts[topic] = e
        slots: list[Any] = []
        for topic, partition, key, value, headers in records:
            if partition is None:
                n = counts[topic]
                if isinstance(n, BaseException):
                    slots.append(n)
                    continue
                turn = self._hash(key) if key is not None and self.hash_keys else next(self._turn)
                partition = turn % n
            slots.append(self._append((topic, partition), key, value, headers))
        return Written(slots)

    async def close(self) -> None:
        """Wait for every builder handed over or filling (before the producer stops)."""
        if self._ships:
            await asyncio.gather(*self._ships, return_exceptions=True)

    def _append(self, tp: tuple[str, int], key, value, headers) -> Any:
        o = self._open.get(tp) or self._new(tp)
        if o.builder.append(timestamp=None, key=key, value=value, headers=list(headers)) is None:
            o = self._new(tp)  # full: the next builder, handed over after this one
            if o.builder.append(timestamp=None, key=key, value=value,
                                headers=list(headers)) is None:
                # Bigger than a whole builder: send() sizes a batch for it.
                return asyncio.ensure_future(self.producer.send_and_wait(
                    tp[0], value, key=key, partition=tp[1], headers=list(headers)))
        o.records += 1
        return o

    def _new(self, tp: tuple[str, int]) -> _Open:
        o = _Open(self.producer.create_batch())
        before = self._tail.get(tp)
        self._open[tp] = self._tail[tp] = o
        task = asyncio.create_task(self._ship(tp, o, before))
        self._ships.add(task)
        task.add_done_callback(self._ships.discard)
        return o

    async def _ship(self, tp: tuple[str, int], o: _Open, before: _Open | None) -> None:
        """Hand ``o`` over once ``before`` is acknowledged; settle ``o.done``."""
        try:
            if before is not None:
                await asyncio.wait([before.done])
            else:
                await asyncio.sleep(0)  # the step that opened it finishes filling it first
            if self._open.get(tp) is o:
                del self._open[tp]
            if o.records == 0:
                o.done.set_result(None)
                return
            try:
                delivered = await self.producer.send_batch(o.builder, tp[0], partition=tp[1])
                await delivered
            except Exception as e:  # noqa: BLE001 - reported per record, the caller retries
                o.done.set_result(e)
                return
            o.done.set_result(None)
        finally:
            if not o.done.done():
                o.done.set_result(asyncio.CancelledError("outbox stopped"))
            if self._open.get(tp) is o:
                del self._open[tp]
            if self._tail.get(tp) is o:
                del self._tail[tp]

    def _hash(self, key: bytes) -> int:
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= _HASH_CACHE:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return h


class Written:
    """Records given to the outbox; :meth:`outcomes` waits for the broker's answer."""

    def __init__(self, slots: list[Any]):
        #: Per record: its builder, a future (sent alone), or the error that kept it out.
        self._slots = slots

    def __len__(self) -> int:
        return len(self._slots)

    async def outcomes(self) -> list[BaseException | None]:
        """Per record, in the order added: None once acknowledged, else the error."""
        waits = {id(s): s.done if isinstance(s, _Open) else s
                 for s in self._slots if isinstance(s, _Open | asyncio.Future)}
        if waits:
            await asyncio.wait(list(waits.values()))
        out: list[BaseException | None] = []
        for s in self._slots:
            if isinstance(s, _Open):
                out.append(s.done.result())
            elif isinstance(s, asyncio.Future):
                out.append(asyncio.CancelledError() if s.cancelled() else s.exception())
            else:
                out.append(s)
        return out
