"""Rate limits through the running admission service: two windows at once, in requests and
in tokens, on a clock that moves only when the test says (the service takes ``now_ms``).

Records go through the broker into admission; what it decides is read back from the
tier topic (admitted) and the results topic (refused). Limits are round so that every
retry-after below was worked out by hand from GCRA's meter form (``producer/ratelimit.py``:
a bucket of units used, draining at limit / window).
"""

from __future__ import annotations

import time

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings, make_producer
from producer.service import AdmissionService, AdmissionSettings
from schemas.messages import AdmittedRequest, Result
from schemas.topics import Topics
from tests.admission_setup import registry
from tests.clock import FakeClock
from tests.integration.pipeline_setup import Reader, running, until

pytestmark = pytest.mark.integration

#: Requests: 2 per second and 3 per minute. Tokens: 6 per second and 10 per minute.
ORGS = {
    "metered": {"tier": "standard", "limits": {"embed": [{"window_s": 1, "requests": 2},
                                                        {"window_s": 60, "requests": 3}]}},
    "tokened": {"tier": "standard", "limits": {"embed": [{"window_s": 1, "tokens": 6},
                                                        {"window_s": 60, "tokens": 10}]}},
}


def body(rid: str, org: str) -> bytes:
    """An embed request of three words: 3 tokens for the fake counter."""
    return msgspec.json.encode({"id": rid, "org": org, "endpoint": "embed",
                                "input": {"type": "embed", "texts": ["one two three"]}})


async def test_request_and_token_limits_hold_over_two_windows(kafka_settings: KafkaSettings,
                                                              topic_prefix: str):
    """The short window refuses a burst and frees up after its retry-after; then the long
    window refuses, with its own retry-after, and admits again exactly when that has passed.
    A refused request costs nothing."""
    cfg = registry(prefix=topic_prefix, orgs=ORGS).config
    topics = Topics.of(cfg)
    clock = FakeClock(time.time())
    service = AdmissionService(cfg, kafka_settings, registry=CollectorRegistry(),
                               settings=AdmissionSettings(token_counter="fake", config_poll_ms=0),
                               now_ms=lambda: int(clock.now * 1000))
    async with running(service), \
            Reader(kafka_settings, topics.tier("standard"), cfg.service.tier_partitions,
                   AdmittedRequest) as admitted, \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions,
                   Result) as refused:
        await until(lambda: service.readiness()[0], "the ingress partitions to be assigned")

        async def step(ids: list[str]) -> tuple[set[str], dict[str, Result]]:
            """Send ``ids`` (org from the first letter) at the clock's now; what was decided."""
            want = set(ids)
            producer = make_producer(kafka_settings)
            await producer.start()
            try:
                for rid in ids:  # plain JSON keyed by org, as an upstream service sends it
                    org = "metered" if rid[0] == "m" else "tokened"
                    await producer.send_and_wait(topics.ingress, body(rid, org),
                                                 key=org.encode())
            finally:
                await producer.stop()
            deadline = time.monotonic() + 15
            while not want <= {x.id for x in admitted.items + refused.items}:
                assert time.monotonic() < deadline, f"timed out waiting for outcomes of {ids}"
                await admitted.until(lambda items: True, "the tier topic")
                await refused.until(lambda items: True, "the results topic")
            return ({a.id for a in admitted.items if a.id in want},
                    {r.id: r for r in refused.items if r.id in want})

        # t = 0: two of three requests, two of three 3-token requests (6 tokens a second).
        ok, no = await step(["m1", "m2", "m3", "t1", "t2", "t3"])
        assert ok == {"m1", "m2", "t1", "t2"}
        assert {(r.id, r.status, r.reason) for r in no.values()} == {
            ("m3", "rejected", "rate_limited"), ("t3", "rejected", "rate_limited")}
        # The 1 s windows: 1 request of 2 drains in 500 ms; 3 tokens of 6 in 500 ms.
        assert no["m3"].retry_after_ms == 500 and "2 requests per 1 s" in no["m3"].message
        assert no["t3"].retry_after_ms == 500 and "6 tokens per 1 s" in no["t3"].message

        # t = 500 ms: the 1 s windows have room for one again (m3 and t3 were not charged).
        clock.advance(0.5)
        ok, no = await step(["m4", "m5", "t4", "t5"])
        assert ok == {"m4", "t4"}
        # Now the 60 s windows bind. Requests: 2.975 used of 3 (3/min drained 0.025),
        # a fourth needs 0.975 more to drain at 3/60,000 per ms: 19,500 ms. Tokens:
        # 8.917 used of 10, 3 more need 1.917 drained at 10/60,000 per ms: 11,500 ms.
        assert no["m5"].reason == "rate_limited" and "3 requests per 60 s" in no["m5"].message
        assert 19_500 <= no["m5"].retry_after_ms <= 19_501
        assert no["t5"].reason == "rate_limited" and "10 tokens per 60 s" in no["t5"].message
        assert 11_500 <= no["t5"].retry_after_ms <= 11_501

        # One millisecond short of the longer retry-after, still refused; at it, admitted.
        clock.advance((no["m5"].retry_after_ms - 1) / 1000)
        ok, no = await step(["m6"])
        assert not ok and no["m6"].reason == "rate_limited"
        clock.advance(0.001)
        ok, no = await step(["m7", "t6"])
        assert ok == {"m7", "t6"}
