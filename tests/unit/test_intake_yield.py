"""The tier intake yields to the event loop within a slice, and stops at a revoked partition.

``TierIntake.run`` holds one fetched slice record by record; every
``_YIELD_EVERY`` records it sets ``wake`` and lets the loop run (the
dispatcher, the consumers' fetchers). A rebalance may revoke a partition
during such a yield: the rest of that partition's slice must then not be
held, since its next owner replays it (held here too, it would be served
twice). A fake consumer hands ``run`` one slice and nothing after it.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.bounded import cancel_within, within
from scheduler import Scheduler
from scheduler.intake import _YIELD_EVERY, TierIntake
from scheduler.metrics import SchedulerMetrics
from scheduler.snapshot import Backlog
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, EmbedInput
from schemas.topics import Topics
from tests.core_setup import ENDPOINT, config_for

SLICE = 100
CONFIG = config_for(orgs={"o": "t0"})
TOPICS = Topics.of(CONFIG)
TP = TopicPartition(TOPICS.tier("t0"), 0)


def _record(offset: int) -> ConsumerRecord:
    now = int(time.time() * 1000)
    req = AdmittedRequest(id=f"r-{offset}", org="o", endpoint=ENDPOINT, tier="t0",
                          input=EmbedInput(texts=("hi",)), tokens=1, created_ms=now,
                          admitted_ms=now, reply_to=TOPICS.results)
    value = codec_for(AdmittedRequest).encode(req, "json")
    return ConsumerRecord(topic=TP.topic, partition=TP.partition, offset=offset, timestamp=now,
                          timestamp_type=0, key=b"o", value=value, checksum=None,
                          serialized_key_size=1, serialized_value_size=len(value),
                          headers=[("content-type", b"application/json")])


class _Consumer:
    """One slice of ``SLICE`` records of ``TP``, then ``drained`` is set and nothing comes."""

    def __init__(self):
        self.slices = [{TP: [_record(i) for i in range(SLICE)]}]
        self.drained = asyncio.Event()

    async def getmany(self, timeout_ms, max_records):
        if self.slices:
            return self.slices.pop()
        self.drained.set()  # run() finished the slice and asks for the next one
        await asyncio.Event().wait()

    async def commit(self, offsets):
        pass


def _intake() -> tuple[TierIntake, _Consumer]:
    core = Scheduler(CONFIG)
    intake = TierIntake(CONFIG, TOPICS, core, Backlog(),
                        SchedulerMetrics(CollectorRegistry(), CONFIG),
                        {"received": 0, "invalid": 0, "duplicates": 0}, asyncio.Event())
    intake._consumer = consumer = _Consumer()
    intake.assigned = {TP}
    return intake, consumer


async def _run_with(intake: TierIntake, consumer: _Consumer, first_turn) -> object:
    """Run the intake; ``first_turn`` runs at the loop's first turn after it; its result."""
    task = asyncio.create_task(intake.run())
    other = asyncio.create_task(first_turn())  # scheduled after run(): runs at its first yield
    try:
        seen = await within(other, 2.0)
        await within(consumer.drained.wait(), 2.0)
        return seen
    finally:
        await cancel_within([task, other], 2.0, "the intake")


async def test_a_slice_lets_the_loop_run_within_it():
    """Another task runs before the slice is all held (wake set by then); then all of it is."""
    intake, consumer = _intake()

    async def look():
        return len(intake._origin), intake.core.held, intake.wake.is_set()

    origin, held, woken = await _run_with(intake, consumer, look)
    assert origin == held and _YIELD_EVERY <= held < SLICE, "the loop waited for the slice"
    assert woken, "the dispatcher was not woken at the yield"
    assert len(intake._origin) == intake.core.held == SLICE


async def test_records_read_after_a_hand_back_mid_slice_are_not_held():
    """Leadership lost at the first yield: the held ones are handed back, the rest never held."""
    intake, consumer = _intake()

    async def depose():
        before = intake.core.held
        intake.hand_back_all()
        return before

    held_at_revoke = await _run_with(intake, consumer, depose)
    assert _YIELD_EVERY <= held_at_revoke < SLICE  # handed back mid-slice
    assert TP not in intake.assigned
    assert intake.core.held == 0, f"{intake.core.held} of the revoked partition held"
    assert not intake._origin
    assert intake.offsets.position(TP) is None
