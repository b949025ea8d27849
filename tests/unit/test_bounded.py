"""Bounded waits end, even when what they wait for will not."""

import asyncio

import pytest

from plumbing.bounded import WaitTimeout, bounded, cancel_within, stop_within, within


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


async def _cancelled_as_it_completes(wait) -> asyncio.Task:
    """A loop in ``wait(fut, 10)``, cancelled in the same tick as ``fut`` gets its result.

    That is a stop arriving as a metadata answer does; on 3.11
    ``asyncio.wait_for`` returns the result then and the loop goes on.
    """
    fut = asyncio.get_running_loop().create_future()

    async def loop_body():
        await wait(fut, 10)
        await asyncio.sleep(3600)  # the loop's next round: reached only if the cancel was lost

    task = asyncio.create_task(loop_body())
    for _ in range(3):
        await asyncio.sleep(0)  # the task is now waiting on fut
    assert not task.done()
    fut.set_result("answer")
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    return task


async def test_within_keeps_a_cancellation_that_arrives_as_the_wait_completes():
    task = await _cancelled_as_it_completes(within)
    assert task.cancelled(), "the cancellation was lost: the loop went on to its next round"


async def test_within_times_out_like_wait_for():
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(10), 0.01)
    assert await within(asyncio.sleep(0, result=3), 1) == 3


async def test_cancel_within_goes_on_without_a_task_that_swallows_its_cancel():
    entered, release = asyncio.Event(), asyncio.Event()
    lines: list[tuple[str, dict]] = []

    class Log:
        def warning(self, event, **kw):
            lines.append((event, kw))

    async def quick():
        await asyncio.sleep(3600)

    stubborn = asyncio.create_task(_stubborn(entered, release), name="stubborn")
    plain = asyncio.create_task(quick(), name="plain")
    await entered.wait()
    ok = await asyncio.wait_for(cancel_within([stubborn, plain], 0.05, "the loops", log=Log()), 30)
    assert ok is False and plain.cancelled() and not stubborn.done()
    assert lines[0][0] == "stop_timed_out" and "stubborn" in lines[0][1]["detail"]
    assert "plain" not in lines[0][1]["detail"]
    release.set()
    assert await stubborn == "released"
    assert await cancel_within([asyncio.create_task(quick())], 5, "one loop") is True
