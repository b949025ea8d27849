"""``simulate --calibrate topic:NAME``: the results a topic holds are what the fit reads."""

from __future__ import annotations

import asyncio

import pytest

from plumbing.kafka import KafkaSettings
from plumbing.topics import ensure_topics
from schemas.codec import codec_for
from schemas.messages import Result
from tests.integration.pipeline_setup import produce
from traffic.calibrate import calibrate

pytestmark = pytest.mark.integration


async def test_results_read_from_a_topic_are_fitted(kafka_settings: KafkaSettings,
                                                    topic_prefix: str):
    """Ok results with their stamps, written to a topic, come back as a fit of their batches."""
    topic = f"{topic_prefix}results"
    await ensure_topics(kafka_settings, {topic: 2})
    codec = codec_for(Result)
    rows = []
    t = 1_000_000
    for b in range(6):  # back-to-back batches of 4 results, two micro-batches of 2
        for i in range(4):
            rows.append(Result(id=f"r{b}-{i}", status="ok", org="bulk", endpoint="embed",
                               tokens=10, batch_id=f"b{b}", worker="w", created_ms=t - 500,
                               admitted_ms=t - 400, dispatched_ms=t - 300 + 100 * b,
                               completed_ms=t + 100 * b + (50 if i >= 2 else 20),
                               inference_ms=10.0))
    rows.append(Result(id="no", status="rejected", org="bulk", endpoint="embed"))
    await produce(kafka_settings, None,
                  [(topic, i % 2, codec.encode(r)) for i, r in enumerate(rows)])
    cal = await asyncio.to_thread(calibrate, f"topic:{topic}", kafka=kafka_settings,
                                  microbatch_size=2)
    fit = cal.endpoints["embed"]
    assert fit.batches == 6 and fit.busy_batches == 5
    # the second micro-batch of each: 30 ms for 2 texts x 10 tokens
    assert fit.ms_per_padded_token.value == pytest.approx(30 / 20)
    with pytest.raises(ValueError, match="not found"):
        await asyncio.to_thread(calibrate, f"topic:{topic_prefix}nothing", kafka=kafka_settings)
