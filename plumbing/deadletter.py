"""Dead letters: a record no service could use is kept, with why, never dropped.

Every consumer loop of the pipeline handles a bad record the same way: the
record goes to the dead-letter topic with a reason code and the error text,
and, where the sender's reply address is known, the sender gets an
``invalid`` result. The loop then moves on: one poisoned record never stops
a service.
"""

from __future__ import annotations

import time

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from schemas.codec import codec_for
from schemas.messages import DeadLetter

__all__ = ["dead_letter", "send_dead_letter"]

_codec = codec_for(DeadLetter)


def dead_letter(record: ConsumerRecord, reason: str, error: str) -> DeadLetter:
    """The dead letter for ``record``: where it came from, why, and its bytes."""
    value = record.value if isinstance(record.value, (bytes, bytearray)) else b""
    key = record.key if isinstance(record.key, (bytes, bytearray)) else None
    return DeadLetter(
        source_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        reason=reason,
        error=error[:2000],
        payload=bytes(value),
        key=bytes(key) if key is not None else None,
        seen_ms=int(time.time() * 1000),
    )


async def send_dead_letter(producer: AIOKafkaProducer, topic: str, record: ConsumerRecord,
                           reason: str, error: str) -> None:
    """Write ``record`` to the dead-letter ``topic`` and wait for the broker's ack."""
    letter = dead_letter(record, reason, error)
    await producer.send_and_wait(
        topic, _codec.encode(letter), headers=[("content-type", b"application/msgpack")]
    )
