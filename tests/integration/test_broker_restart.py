"""A broker that restarts empty (Tansu's memory store): services and clients recover.

The full scenario is ``bench/broker_restart.py`` (figures in
``docs/reliability.md``); here a short run of it, and the client alone.
"""

from __future__ import annotations

import asyncio

import pytest

from bench import broker_stall
from bench.broker_restart import passed, report, run
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from producer.client import FairnessClient, ResultLost

pytestmark = pytest.mark.integration


async def test_pipeline_recovers_and_nothing_is_lost():
    """After a restart every service recreates its topics and goes on; every request gets a
    result (one declared lost, or whose submit raised, after it is sent again under a new
    id), counted by id: none twice, none foreign; and only one the restart could have caught
    is declared lost."""
    lines: list[str] = []
    f = await run(rate=20, before_s=3, after_s=7, lost_grace_s=4, say=lines.append)
    print("\n".join(lines) + "\n" + report(f))
    assert f["sent_before"] > 0 and f["sent_after"] > 0, report(f)
    assert f["unanswered"] == 0 and f["submit_failed"] == 0, report(f)
    assert f["duplicated"] == 0 and f["foreign"] == 0, report(f)
    assert f["lost_after_recovery"] == 0, report(f)
    assert f["declared_lost"] <= f["exposed"], report(f)
    assert passed(f)
    assert f["failed_process"] is None
    # Answered, and served again (not all "ok": a Tansu produce that hangs for
    # the 40 s request timeout, seen about once in three runs, holds admission
    # up and the requests it then finds past their target are throttled).
    assert f["sent_after_recovery"] > 0
    assert f["answered_after_recovery"] == f["sent_after_recovery"]
    assert f["ok_after_recovery"] > 0
    # One line per service instance: two schedulers, admission, one worker.
    assert f["broker_restarted_lines"] == {"scheduler": 2, "admission": 1, "worker": 1}
    assert f["client_saw_loss"] == 1


async def test_client_is_told_its_request_was_lost():
    """A request in flight when the broker loses everything fails with ResultLost, not forever."""
    async with EmbeddedBroker() as broker:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="lost-test")
        async with FairnessClient(kafka, "lost.", lost_grace_s=1.0) as client:
            await broker_ready_for(kafka)
            rid = await client.submit({"org": "acme", "endpoint": "embed",
                                       "input": {"type": "embed", "texts": ["hi"]}})
            waiting = asyncio.ensure_future(client.result(rid, timeout=None))
            await broker.arestart(grace_s=0)
            with pytest.raises(ResultLost, match=rid):
                await asyncio.wait_for(waiting, 20)
            assert rid in client.lost_requests()
            with pytest.raises(ResultLost):
                await client.result(rid, timeout=1)


async def broker_ready_for(kafka: KafkaSettings) -> None:
    """The ingress topic exists (nobody runs admission here): submit must not auto-create it."""
    from plumbing.topics import ensure_topics

    await ensure_topics(kafka, {"lost.requests": 1})


async def test_a_frozen_broker_loses_nothing_and_answers_each_request_once():
    """``bench/broker_stall.py`` short (SIGSTOP 4 s, not 8; one produce timeout, 5 s):
    nothing is lost by the broker, so every request comes back exactly once, counted by id."""
    lines: list[str] = []
    f = await broker_stall.run(produce_timeout_ms=5000, rate=30, before_s=3, stall_s=4, after_s=3,
                        say=lines.append)
    print("\n".join(lines) + "\n" + broker_stall.report([f]))
    assert f["sent"] > 0 and f["during_ms"]["n"] > 0, broker_stall.report([f])
    assert f["drained"] and f["unanswered"] == 0, broker_stall.report([f])
    assert f["submit_failed"] == 0 and f["duplicated"] == 0 and f["foreign"] == 0, f["by_id"]
    assert broker_stall.passed(f)
    assert f["failed_process"] is None
