"""One produce-and-read timing, shared by the benches that compare with a raw Kafka hop.

``bench/pipeline.py`` times one raw hop with it (the same topic both ends),
``bench/raw_chain.py`` four hops through relays (first and last topic
differ). Light on purpose: ``bench/raw_chain.py``'s relay processes import
it again when they start.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, make_producer

__all__ = ["produce_and_read"]


async def produce_and_read(kafka: KafkaSettings, first: str, last: str, partitions: int,
                           values: list[bytes], keys: list[bytes],
                           timeout_s: float = 300.0) -> float:
    """Seconds from the first send of ``values`` to ``first`` until as many are read from ``last``.

    ``last`` (``partitions`` of it) is read by a consumer without a group from
    its beginning; the sends go out without waiting, then every
    acknowledgement. The same topic for both is one raw hop.
    """
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    producer = make_producer(kafka)
    await producer.start()
    try:
        tps = [TopicPartition(last, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = len(values)

        async def read() -> None:
            seen = 0
            while seen < n:
                got = await consumer.getmany(timeout_ms=100)
                seen += sum(len(r) for r in got.values())

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.2)  # the consumer's first fetch is out
        t0 = time.perf_counter()
        futures = [await producer.send(first, v, key=k) for v, k in zip(values, keys, strict=True)]
        await asyncio.gather(*futures)
        try:
            async with asyncio.timeout(timeout_s):
                await reader
        except TimeoutError:
            raise TimeoutError(f"{n} records sent to {first!r} were not all read from {last!r} "
                               f"within {timeout_s:g} s") from None
        return time.perf_counter() - t0
    finally:
        await producer.stop()
        await consumer.stop()
