"""The tier intake's bookkeeping once per pack: one offset held once per request, the
backlog counted per org, and the loop let run every ``_YIELD_EVERY`` requests (not
records: a pack of 20 counts 20)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.bounded import cancel_within, within
from plumbing.offsets import OffsetTracker
from scheduler import Scheduler
from scheduler.intake import _YIELD_EVERY, TierIntake
from scheduler.metrics import SchedulerMetrics
from scheduler.snapshot import Backlog
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, EmbedInput
from schemas.packs import PACK_HEADER, encode_packed
from schemas.topics import Topics
from tests.core_setup import ENDPOINT, config_for

CONFIG = config_for(orgs={"a": "t0", "b": "t0"})
TOPICS = Topics.of(CONFIG)
TP = TopicPartition(TOPICS.tier("t0"), 0)
PACK = 20
_codec = codec_for(AdmittedRequest)


def _pack(offset: int, orgs: list[str]) -> ConsumerRecord:
    now = int(time.time() * 1000)
    items = [_codec.encode(AdmittedRequest(
        id=f"r-{offset}-{i}", org=org, endpoint=ENDPOINT, tier="t0",
        input=EmbedInput(texts=("hi",)), tokens=2, created_ms=now, admitted_ms=now,
        reply_to=TOPICS.results)) for i, org in enumerate(orgs)]
    value = encode_packed(items)
    return ConsumerRecord(topic=TP.topic, partition=TP.partition, offset=offset, timestamp=now,
                          timestamp_type=0, key=b"a", value=value, checksum=None,
                          serialized_key_size=1, serialized_value_size=len(value),
                          headers=[("content-type", b"application/msgpack"), PACK_HEADER])


def _intake() -> TierIntake:
    core = Scheduler(CONFIG)
    intake = TierIntake(CONFIG, TOPICS, core, Backlog(),
                        SchedulerMetrics(CollectorRegistry(), CONFIG),
                        {"received": 0, "invalid": 0, "duplicates": 0}, asyncio.Event())
    intake.assigned = {TP}
    return intake


def test_offsets_held_and_released_several_times_at_once():
    """``hold(times=3)`` needs three releases, in any grouping; a release beyond drops it."""
    t = OffsetTracker()
    t.hold(TP, 7, 3)
    t.release(TP, 7, 2)
    assert t.holds(TP, 7) and t.committable(TP) == 7
    t.release(TP, 7)
    assert not t.holds(TP, 7) and t.committable(TP) == 8
    t.hold(TP, 8, 2)
    t.release(TP, 8, 5)
    assert not t.holds(TP, 8) and t.committable(TP) == 9


def test_a_packs_offset_is_held_until_its_last_request_is_released():
    """Three requests of one pack dispatched in two batches: the offset moves after both."""
    intake = _intake()
    received: dict[str, int] = {}
    assert intake._hold_record(TP, _pack(5, ["a", "a", "b"]), 1_000, received) == []
    assert received == {"t0": 3} and intake.core.held == 3
    assert intake.offsets.committable(TP) == 5
    assert intake.backlog.active_orgs(ENDPOINT) == {"t0": 2}
    assert intake.backlog.org_tokens(ENDPOINT) == {"a": 4, "b": 2}
    intake.release_all(["r-5-0", "r-5-2"])
    assert intake.offsets.committable(TP) == 5, "committed past a request still held"
    intake.release_all(["r-5-1", "r-5-1"])  # a second release of one id changes nothing
    assert intake.offsets.committable(TP) == 6
    assert (TP, 5) not in intake._floor_at


def test_a_duplicate_in_a_pack_is_not_held_twice():
    """A pack whose every request is held already: nothing more is held for it."""
    intake = _intake()
    intake._hold_record(TP, _pack(1, ["a", "b"]), 1_000, {})
    dup = dataclasses.replace(_pack(1, ["a", "b"]), offset=2)
    intake._hold_record(TP, dup, 1_000, {})
    assert intake.core.held == 2
    assert intake.offsets.holds(TP, 1) and not intake.offsets.holds(TP, 2)
    assert intake.offsets.committable(TP) == 1
    intake.release_all(["r-1-0", "r-1-1"])
    assert intake.offsets.committable(TP) == 3


class _Consumer:
    def __init__(self, records):
        self.slices = [{TP: records}]
        self.drained = asyncio.Event()

    async def getmany(self, timeout_ms, max_records):
        if self.slices:
            return self.slices.pop()
        self.drained.set()
        await asyncio.Event().wait()

    async def commit(self, offsets):
        pass


async def test_the_loop_runs_within_a_few_dozen_requests_of_packs():
    """A slice of packs of 20: another task runs before ``_YIELD_EVERY`` requests and one
    pack more are held, not ``_YIELD_EVERY`` packs."""
    intake = _intake()
    records = [_pack(i, ["a"] * PACK) for i in range(_YIELD_EVERY + 2)]
    intake._consumer = consumer = _Consumer(records)
    task = asyncio.create_task(intake.run())

    async def look():
        return intake.core.held

    other = asyncio.create_task(look())
    try:
        held = await within(other, 2.0)
        await within(consumer.drained.wait(), 2.0)
    finally:
        await cancel_within([task, other], 2.0, "the intake")
    assert 0 < held < _YIELD_EVERY + PACK, f"the loop waited for {held} requests"
    assert intake.core.held == PACK * len(records)
