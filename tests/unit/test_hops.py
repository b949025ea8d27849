"""The tier topic's hop, measured by the intake and published in the scheduler's snapshot.

The throttle adds the snapshot's ``hops_ms`` to every prediction
(``tests/unit/test_throttle.py``); here: the intake samples the hop of the
newest record each fetch reads, a fetch of older records samples nothing,
and the service publishes the intake's figure on every lane.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from plumbing.bounded import cancel_within, within
from plumbing.kafka import KafkaSettings
from scheduler import Scheduler
from scheduler.dispatch import Dispatcher
from scheduler.flow import FlowControl
from scheduler.intake import TierIntake
from scheduler.metrics import SchedulerMetrics
from scheduler.publish import snapshot
from scheduler.service import SchedulerService
from scheduler.snapshot import Backlog, ServiceRate
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, EmbedInput, SchedulerState
from tests.core_setup import ENDPOINT
from tests.unit.test_intake_yield import CONFIG, TOPICS, TP


def _record(offset: int, admitted_ms: int) -> ConsumerRecord:
    req = AdmittedRequest(id=f"r-{offset}", org="o", endpoint=ENDPOINT, tier="t0",
                          input=EmbedInput(texts=("hi",)), tokens=1, created_ms=admitted_ms,
                          admitted_ms=admitted_ms, reply_to=TOPICS.results)
    value = codec_for(AdmittedRequest).encode(req, "json")
    return ConsumerRecord(topic=TP.topic, partition=TP.partition, offset=offset,
                          timestamp=admitted_ms, timestamp_type=0, key=b"o", value=value,
                          checksum=None, serialized_key_size=1, serialized_value_size=len(value),
                          headers=[("content-type", b"application/json")])


class _Consumer:
    """The given slices, one per fetch; then ``drained`` is set and nothing more comes."""

    def __init__(self, slices: list[list[ConsumerRecord]], intake: TierIntake):
        self.slices = [{TP: s} for s in reversed(slices)]
        self.drained = asyncio.Event()
        self.intake = intake
        #: The intake's hop average as each fetch began.
        self.hops_seen: list[float | None] = []

    async def getmany(self, timeout_ms, max_records):
        self.hops_seen.append(self.intake.hops.ms)
        if self.slices:
            if len(self.hops_seen) > 1:
                await asyncio.sleep(0.3)  # the next fetch comes a while later
            return self.slices.pop()
        self.drained.set()
        await asyncio.Event().wait()


async def _read(slices: list[list[ConsumerRecord]]) -> tuple[TierIntake, _Consumer]:
    intake = TierIntake(CONFIG, TOPICS, Scheduler(CONFIG), Backlog(),
                        SchedulerMetrics(CollectorRegistry(), CONFIG),
                        {"received": 0, "invalid": 0, "duplicates": 0}, asyncio.Event())
    intake._consumer = consumer = _Consumer(slices, intake)
    intake.assigned = {TP}
    task = asyncio.create_task(intake.run())
    try:
        await within(consumer.drained.wait(), 5.0)
    finally:
        await cancel_within([task], 2.0, "the intake")
    return intake, consumer


async def test_a_fetch_samples_the_hop_of_its_newest_record_not_its_backlog():
    """Records admitted 5 s and 0.4 s ago in one fetch: the hop is the newest one's way,
    about 400 ms (the scheduler's clock at the fetch less its admitted_ms)."""
    now = int(time.time() * 1000)
    before = time.time()
    intake, _ = await _read([[_record(0, now - 5_000), _record(1, now - 400)]])
    waited_ms = (time.time() - before) * 1000
    assert intake.core.held == 2
    assert 400 <= intake.hops.ms <= 400 + waited_ms + 1
    assert intake.hops.published_ms(time.time()) == pytest.approx(2 * intake.hops.ms)


async def test_a_fetch_of_records_older_than_one_already_read_samples_nothing():
    """The second fetch, 0.3 s after the first, brings only a record admitted before the
    newest one read: nothing in it is a fresh record's way (taking the newest one read
    again would time the pause between the fetches), so the hop stays the first fetch's."""
    now = int(time.time() * 1000)
    intake, consumer = await _read([[_record(0, now - 100)], [_record(1, now - 60_000)]])
    assert intake.core.held == 2
    first = consumer.hops_seen[1]  # as the second fetch began
    assert first is not None and first >= 100
    assert intake.hops.ms == first


def test_the_service_publishes_the_intakes_hops_on_every_lane():
    """The snapshot the leader sends carries the intake's figure, doubled (in and out)."""
    svc = SchedulerService(CONFIG, KafkaSettings(bootstrap="127.0.0.1:9"),
                           registry=CollectorRegistry())
    sent: list[SchedulerState] = []
    svc._send_state = sent.append  # what _publish_state hands to _spawn: nothing to run
    svc._spawn = lambda _: None
    now = time.time()
    svc.intake.hops.observe(35.0, now)
    svc._publish_state(now)
    assert sent and set(sent[0].lanes) == {ENDPOINT}
    assert sent[0].lanes[ENDPOINT].hops_ms == 70.0


def test_a_snapshot_carries_the_hops_it_is_given():
    """scheduler.publish.snapshot puts ``hops_ms`` on each lane it builds."""
    core = Scheduler(CONFIG)
    flow = FlowControl(10_000, mode="slots")
    backlog = Backlog()
    state, _ = snapshot(1.0, core=core, flow=flow, backlog=backlog, rates=ServiceRate(),
                        dispatcher=Dispatcher(core, flow, backlog, instance="s1"), epoch=1,
                        top_orgs=5, hops_ms=42.0)
    assert [lane.hops_ms for lane in state.lanes.values()] == [42.0]
