"""A client that is not ours: raw JSON bytes from librdkafka, as kcat sends them.

kcat and most non-Java clients are built on librdkafka; ``confluent-kafka``
wraps the same library, so this is the README's kcat example run in-process:
no content-type header, the org as key, the documented JSON as value.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer

from app.stack import Stack
from schemas.build import build_config

ROOT = Path(__file__).resolve().parents[2]

# Exactly the README's request (section "Send a request").
README_REQUEST = (
    '{"id": "req-1", "org": "quiet-1", "endpoint": "embed",'
    ' "input": {"type": "embed", "texts": ["hello world"]}}'
)


def _produce_and_read(bootstrap: str, ingress: str, results: str, timeout_s: float,
                      quiet_s: float = 2.0) -> list[dict]:
    """Send the README's request; every result read until ``quiet_s`` after the first one
    (or ``timeout_s``), so a second copy is seen, not cut off by stopping at the first."""
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(ingress, README_REQUEST.encode(), key=b"quiet-1")
    assert producer.flush(10) == 0, "librdkafka could not deliver the request"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readme-{time.time_ns()}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([results])
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                if not got:  # a second copy would come within quiet_s of the first
                    deadline = min(deadline, time.monotonic() + quiet_s)
                got.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return got


async def test_readme_json_request_from_librdkafka_is_served(kafka_settings, topic_prefix):
    """The README's raw JSON, sent by librdkafka with no headers, comes back as one ok result."""
    config = build_config(base=(ROOT / "examples" / "config.toml").read_text(),
                          prefix=topic_prefix).config
    async with Stack(config, kafka_settings, model="fake") as stack:
        results = await asyncio.to_thread(
            _produce_and_read, kafka_settings.bootstrap, stack.topics.ingress,
            stack.topics.results, 30.0)
    assert len(results) == 1, results
    r = results[0]
    assert (r["id"], r["status"], r["org"], r["endpoint"]) == ("req-1", "ok", "quiet-1", "embed")
    assert len(r["embeddings"]) == 1 and len(r["embeddings"][0]) > 0
