"""What a new leader does before its first batch, in this order.

1. **Positions.** Each leadership commits its tier positions to a group of
   its own, ``<prefix>scheduler.<epoch>``, that nobody subscribes to: Kafka
   takes a commit with generation -1 and no member id for a group with no
   members, so the leader reads and commits at once, with no join and no
   session to wait out. A deposed leader that wakes up and commits writes
   only its own group, which its successor has already read: it can never
   move the successor's positions. The new leader reads its predecessor's
   group (walking back the chain of epochs where one has nothing for a
   partition, then the pre-epoch group ``<prefix>scheduler``), and copies
   the positions into its own group at once, so that its own successor
   finds them even if it dies before its first commit.
2. **Fences.** It writes a record marked ``fence`` with its epoch to every
   partition of every batch topic and waits for the acknowledgements. A
   worker takes the fence as the partition's newest epoch and refuses any
   older epoch's batch behind it: whatever the deposed leader still sends
   (a paused process resuming with batches in its producer) is never served.
3. **What was dispatched.** It reads every batch partition from the
   predecessor's floor (the last beat's ``floor_ms``: every batch holding a
   request not committed yet was written after it) up to its own fence,
   and collects the request ids of the batches the workers will serve
   (not those behind a newer epoch's fence on their partition). Those are
   skipped when the tier records are replayed: they are not dispatched
   twice.

Positions are read *before* the fences are written, so a predecessor's
commit that covers a batch written after a fence (a refused one) always
comes after the read.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from plumbing.bounded import within
from plumbing.kafka import KafkaSettings, make_consumer
from schemas.codec import DecodeError, codec_for, content_type, format_from_headers
from schemas.messages import Batch

__all__ = ["Dispatched", "batch_reader", "copy_positions", "dispatched_before", "group_of",
           "partitions_of", "tier_positions", "write_fences"]

log = structlog.get_logger("scheduler")

_batch_codec = codec_for(Batch)
_MSGPACK_HEADERS = [("content-type", content_type("msgpack").encode())]


def group_of(prefix: str, epoch: int) -> str:
    """The group a leadership of ``epoch`` commits its tier positions to (0: the old one)."""
    return f"{prefix}scheduler.{epoch}" if epoch else f"{prefix}scheduler"


async def partitions_of(producer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` the producer's metadata knows."""
    out: list[TopicPartition] = []
    for t in topics:
        ps = await within(producer.partitions_for(t), 10)
        out.extend(TopicPartition(t, p) for p in sorted(ps))
    return out


async def tier_positions(admin, prefix: str, chain: list[int],
                         tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Each partition's committed position in the newest group of ``chain`` that has one
    (then the pre-epoch group); partitions none has are left out (read from the start).
    ``admin``: a started :func:`plumbing.kafka.make_admin` client."""
    found: dict[TopicPartition, int] = {}
    for epoch in [*chain, 0]:
        missing = [tp for tp in tps if tp not in found]
        if not missing:
            break
        got = await within(admin.list_consumer_group_offsets(
            group_of(prefix, epoch), partitions=missing), 10)
        for tp, om in got.items():
            if om is not None and om.offset >= 0:
                found[tp] = om.offset
    return found


async def copy_positions(consumer, positions: dict[TopicPartition, int]) -> None:
    """Commit ``positions`` to ``consumer``'s group (no member: generation -1)."""
    if positions:
        await within(consumer.commit({tp: OffsetAndMetadata(o, "")
                                      for tp, o in positions.items()}), 10)


async def write_fences(producer, tps: list[TopicPartition], *, epoch: int, instance: str,
                       endpoint_of: dict[str, str]) -> dict[TopicPartition, int]:
    """A fence of ``epoch`` on every batch partition; the offset each landed at."""
    now_ms = int(time.time() * 1000)
    futures = []
    for tp in tps:
        fence = Batch(id=f"{instance}-fence-{epoch}-{tp.partition}",
                      endpoint=endpoint_of[tp.topic], requests=[], tokens=0, created_ms=now_ms,
                      epoch=epoch, fence=True)
        futures.append((tp, await producer.send(tp.topic, _batch_codec.encode(fence),
                                                key=fence.id.encode(), partition=tp.partition,
                                                headers=_MSGPACK_HEADERS)))
    out = {}
    for tp, fut in futures:
        md = await within(fut, 10)
        out[tp] = md.offset
    return out


class _RequestId(msgspec.Struct):
    id: str


class _BatchIds(msgspec.Struct):
    """The part of a Batch a takeover reads (the inputs are skipped, not decoded)."""

    id: str = ""
    epoch: int = 0
    fence: bool = False
    requests: list[_RequestId] = []


_ids_decoders: dict[str, msgspec.msgpack.Decoder[_BatchIds] | msgspec.json.Decoder[_BatchIds]] = {
    "msgpack": msgspec.msgpack.Decoder(_BatchIds), "json": msgspec.json.Decoder(_BatchIds)}


@dataclass
class Dispatched:
    """Request ids in batches a predecessor wrote that workers serve, and what was read."""

    ids: set[str] = field(default_factory=set)
    batches: int = 0
    stale_batches: int = 0
    records: int = 0
    complete: bool = True


def batch_reader(kafka: KafkaSettings):
    """The consumer :func:`dispatched_before` reads with: made and started ahead of a
    takeover, so that one costs no connection."""
    return make_consumer(kafka, group_id=None, max_partition_fetch_bytes=4 * 1024 * 1024)


async def dispatched_before(consumer, fences: dict[TopicPartition, int], *,
                            since_ms: int, stale_below: int, timeout_s: float) -> Dispatched:
    """Ids of the requests in batches written to ``fences``' partitions from ``since_ms``
    (record time) up to each fence.

    A batch of a lower epoch than one already read on its partition (from
    ``stale_below`` on: a fence written before ``since_ms``) is behind a
    newer leader's fence: workers refuse it, so its requests still need
    serving. ``complete`` is False if the read did not reach every fence
    within ``timeout_s`` (then some may be dispatched twice).
    """
    out = Dispatched()
    todo = {tp: off for tp, off in fences.items() if off > 0}
    if not todo:
        return out
    try:
        consumer.assign(list(todo))
        found = await within(consumer.offsets_for_times({tp: since_ms for tp in todo}), 10)
        for tp in list(todo):
            hit = found.get(tp)
            if hit is None or hit.offset >= todo[tp]:
                del todo[tp]  # nothing that recent before the fence
            else:
                consumer.seek(tp, hit.offset)
        newest = dict.fromkeys(todo, stale_below)
        deadline = time.monotonic() + timeout_s
        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                out.complete = False
                log.warning("takeover_read_incomplete", partitions=len(todo),
                            timeout_s=timeout_s)
                break
            got = await consumer.getmany(*todo, timeout_ms=int(min(left, 0.5) * 1000))
            for tp, records in got.items():
                end = todo.get(tp)
                if end is None:
                    continue
                for rec in records:
                    if rec.offset >= end:
                        del todo[tp]
                        break
                    out.records += 1
                    _read_batch(rec, tp, newest, out)
                else:
                    if records and records[-1].offset + 1 >= end:
                        del todo[tp]
    except (KafkaError, TimeoutError) as e:
        out.complete = False
        log.warning("takeover_read_failed", error=repr(e))
    finally:
        consumer.assign([])
    return out


def _read_batch(rec, tp: TopicPartition, newest: dict[TopicPartition, int],
                out: Dispatched) -> None:
    try:
        b = _ids_decoders[format_from_headers(rec.headers)].decode(rec.value or b"")
    except (msgspec.DecodeError, DecodeError, ValueError, KeyError):
        return  # a poisoned record: the workers dead-letter it
    if b.epoch < newest[tp]:
        out.stale_batches += 1
        return
    newest[tp] = b.epoch
    if b.fence:
        return
    out.batches += 1
    out.ids.update(r.id for r in b.requests)
