"""The topic keeper's evidence of a lost broker: a consumer stuck beyond the end, not a lag."""

import asyncio

from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings
from plumbing.topickeeper import TopicKeeper

TP = TopicPartition("t.replies.x", 0)


class Consumer:
    """A consumer with a settable high watermark and position; records its seeks."""

    def __init__(self, high: int, pos: int):
        self.high, self.pos, self.seeks = high, pos, []

    def assignment(self):
        return {TP}

    def highwater(self, tp):
        return self.high

    async def position(self, tp):
        return self.pos

    async def seek_to_beginning(self, *tps):
        self.seeks.append(tps)


def keeper(consumer) -> TopicKeeper:
    k = TopicKeeper(KafkaSettings(bootstrap="127.0.0.1:1"), client=None,
                    specs=lambda: {TP.topic: 1}, service="test", follow=lambda: [consumer])
    k.known({TP.topic: 1})

    async def metadata(topics):
        return {TP.topic: 1}

    k.metadata = metadata
    return k


def test_a_high_watermark_that_lags_once_is_no_evidence():
    """Under a burst the answer's high watermark can trail the position: records keep coming."""
    c = Consumer(high=100, pos=101)
    k = keeper(c)
    assert asyncio.run(k.check()) == []
    c.high, c.pos = 180, 181  # lagging again, but the consumer moved on: still reading
    assert asyncio.run(k.check()) == []
    c.high, c.pos = 300, 250  # caught up
    assert asyncio.run(k.check()) == []
    assert c.seeks == []


def test_a_consumer_stuck_beyond_the_end_is_evidence_and_goes_back_to_the_start():
    """After a restart the partition is empty and the consumer's position stays beyond it."""
    c = Consumer(high=0, pos=5_000)
    k = keeper(c)
    assert asyncio.run(k.check()) == []  # one sighting
    evidence = asyncio.run(k.check())
    assert evidence == [f"high watermark of {TP.topic}[0] below our position"]
    assert c.seeks == [(TP,)]
