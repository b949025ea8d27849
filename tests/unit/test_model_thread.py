"""ModelThread: one thread, calls in order, a continuation placed when its call ends."""

import asyncio
import threading

import pytest

from tests.integration.pipeline_setup import until
from worker.model_thread import Job, ModelThread


def gated(log: list[str], name: str, gate: threading.Event | None = None):
    def call():
        log.append(name)
        if gate is not None:
            assert gate.wait(10), "the test never opened the gate"
        return name
    return call


async def held_open(t: ModelThread, log: list[str], name: str) -> tuple[Job, threading.Event]:
    """A call held open in ``t`` until the returned gate is set, once it is running."""
    gate = threading.Event()
    job = t.submit(gated(log, name, gate))
    await until(lambda: log == [name], f"{name} running", timeout_s=10)
    return job, gate


async def test_calls_run_in_one_thread_in_the_order_handed_over():
    threads: set[int] = set()
    log: list[str] = []
    t = ModelThread()

    def call(i):
        threads.add(threading.get_ident())
        log.append(i)
        return i * 2

    got = await asyncio.gather(*(t(call, i) for i in range(20)))
    assert got == [i * 2 for i in range(20)]
    assert log == list(range(20))
    assert len(threads) == 1 and threading.get_ident() not in threads
    t.close()


async def test_a_continuation_waits_for_its_call_to_end_then_for_the_calls_handed_over_before():
    log: list[str] = []
    t = ModelThread()
    a0, gate = await held_open(t, log, "a0")
    a1 = t.submit(gated(log, "a1"), follows=a0)  # A's next, handed over as a0 runs
    b0 = t.submit(gated(log, "b0"))              # a newer batch, handed over meanwhile
    assert a1.key is None and b0.key is not None
    gate.set()
    await asyncio.wait_for(asyncio.gather(a0.future, a1.future, b0.future), 10)
    assert log == ["a0", "b0", "a1"]
    # Handed over after its call ended, a continuation is an ordinary call.
    late = t.submit(gated(log, "late"), follows=a0)
    assert late.key is not None
    assert await late.future == "late"
    t.close()


async def test_a_continuation_of_a_call_dropped_before_it_ran_still_runs():
    log: list[str] = []
    t = ModelThread()
    first, gate = await held_open(t, log, "first")
    dropped = t.submit(gated(log, "dropped"))
    after = t.submit(gated(log, "after"), follows=dropped)
    dropped.future.cancel()
    gate.set()
    assert await asyncio.wait_for(after.future, 10) == "after"
    assert await first.future == "first"
    assert log == ["first", "after"]
    t.close()


async def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    t = ModelThread()

    def boom():
        raise ValueError("model exploded")

    with pytest.raises(ValueError, match="model exploded"):
        await t(boom)
    assert await t(lambda: 7) == 7
    t.close()


async def test_setup_runs_in_the_thread_and_a_failed_setup_fails_every_call():
    seen: list[int] = []
    t = ModelThread(lambda: seen.append(threading.get_ident()))
    assert await t(threading.get_ident) == seen[0]
    t.close()

    def broken():
        raise OSError("no device")

    t = ModelThread(broken)
    with pytest.raises(RuntimeError, match="could not be set up"):
        await asyncio.wait_for(t(lambda: 1), 10)
    t.close()


async def test_close_cancels_the_calls_not_started():
    log: list[str] = []
    t = ModelThread()
    running, gate = await held_open(t, log, "running")
    waiting = t.submit(gated(log, "waiting"))
    t.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting.future, 10)
    gate.set()
    assert await asyncio.wait_for(running.future, 10) == "running"
    assert log == ["running"]
    with pytest.raises(RuntimeError, match="closed"):
        t.submit(lambda: None)
