"""Bounded waits end, even when what they wait for will not."""

import asyncio

import pytest

from plumbing.bounded import WaitTimeout, bounded, stop_within


async def _stubborn(entered: asyncio.Event, release: asyncio.Event) -> str:
    """Swallows every cancellation until ``release`` is set (a library shutdown that does)."""
    entered.set()
    while True:
        try:
            await release.wait()
            return "released"
        except asyncio.CancelledError:
            continue


async def test_a_wait_that_ignores_its_cancel_still_ends_and_names_what_it_waited_for():
    entered, release = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_stubborn(entered, release))
    waiting = asyncio.create_task(bounded(task, 0.05, "the stubborn part to stop"))
    # The bound is the only way out: without it this waits for ever.
    done, _ = await asyncio.wait({waiting}, timeout=30)
    assert done, "bounded() waited for a cancelled awaitable that never ended"
    with pytest.raises(WaitTimeout, match="the stubborn part to stop"):
        waiting.result()
    release.set()
    assert await task == "released"  # left behind, not destroyed


async def test_stop_within_goes_on_without_the_part_that_hangs():
    entered, release = asyncio.Event(), asyncio.Event()
    lines: list[tuple[str, dict]] = []

    class Log:
        def warning(self, event, **kw):
            lines.append((event, kw))

    stubborn = asyncio.create_task(_stubborn(entered, release))
    ok = await asyncio.wait_for(stop_within(stubborn, 0.05, "the consumer to stop", log=Log()),
                                30)
    assert ok is False
    assert lines and lines[0][0] == "stop_timed_out" and lines[0][1]["what"] == "the consumer to stop"
    release.set()
    await stubborn


async def test_a_result_and_an_error_come_through():
    async def value():
        return 7

    async def fails():
        raise ValueError("no")

    assert await bounded(value(), 5, "a value") == 7
    with pytest.raises(ValueError, match="no"):
        await bounded(fails(), 5, "an error")


async def test_cancelling_the_wait_cancels_what_it_waited_for():
    never = asyncio.Event()
    inner = asyncio.ensure_future(never.wait())
    outer = asyncio.create_task(bounded(inner, 60, "nothing"))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.sleep(0)
    assert inner.cancelled()


async def test_a_client_whose_consumer_will_not_stop_still_closes():
    """FairnessClient.stop() bounds each step: a hung consumer stop is left behind, logged."""
    from plumbing.kafka import KafkaSettings
    from producer.client import FairnessClient

    entered, release = asyncio.Event(), asyncio.Event()
    stopped: list[str] = []

    class HungConsumer:
        async def stop(self):
            await _stubborn(entered, release)

    class Producer:
        async def stop(self):
            stopped.append("producer")

    client = FairnessClient(KafkaSettings(bootstrap="127.0.0.1:1"), "t.", stop_timeout_s=0.05)
    client._consumer, client._producer = HungConsumer(), Producer()
    await asyncio.wait_for(client.stop(), 30)
    assert stopped == ["producer"], "the steps after the hung one did not run"
    assert client._consumer is None and client._producer is None
    release.set()
