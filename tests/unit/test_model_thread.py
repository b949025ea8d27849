"""ModelThread: one thread, calls in order, a continuation placed when its call ends,
an urgent call sharing the next one's model call."""

import asyncio
import functools
import threading

import pytest

from tests.integration.pipeline_setup import until
from worker.model_thread import Job, Joinable, ModelThread


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


# -- joined calls --------------------------------------------------------------


def model_fn(log: list):
    """A model call on items: each item's output tagged with its length; ``boom`` raises."""
    def fn(items, *, lengths, **kwargs):
        log.append(tuple(items))
        if "boom" in items:
            raise ValueError("model exploded")
        return [f"{x}:{n}" for x, n in zip(items, lengths, strict=True)]
    return fn


def submit_joinable(t: ModelThread, fn, items, *, urgent=False, kwargs=None,
                    fits=lambda a, b: True) -> Job:
    join = Joinable(fn, items, [len(x) for x in items], kwargs or {}, fits,
                    lambda out, a, b: out[a:b])
    return t.submit(functools.partial(fn, items, lengths=join.lengths, **join.kwargs),
                    urgent=urgent, join=join)


async def test_an_urgent_call_shares_one_model_call_with_the_call_after_it():
    log: list = []
    t = ModelThread()
    fn = model_fn(log)
    _, gate = await held_open(t, log, "running")
    regular = submit_joinable(t, fn, ["bb", "ccc"])
    later = submit_joinable(t, fn, ["dddd"])
    urgent = submit_joinable(t, fn, ["a"], urgent=True)
    gate.set()
    got = await asyncio.wait_for(asyncio.gather(urgent.future, regular.future, later.future), 10)
    assert log == ["running", ("a", "bb", "ccc"), ("dddd",)]
    assert got == [["a:1"], ["bb:2", "ccc:3"], ["dddd:4"]]
    # One call, reported once: by the urgent call, whose items came first.
    assert urgent.joined == ([1, 2, 3], True) and regular.joined == ([1, 2, 3], False)
    assert later.joined is None
    assert urgent.seconds == regular.seconds > 0
    t.close()


async def test_only_an_urgent_call_joins_and_only_a_call_that_fits_and_computes_alike():
    log: list = []
    t = ModelThread()
    fn, other = model_fn(log), model_fn(log)
    _, gate = await held_open(t, log, "running")
    jobs = [submit_joinable(t, fn, ["r1"]), submit_joinable(t, fn, ["r2"]),  # neither urgent
            submit_joinable(t, fn, ["u1"], urgent=True, kwargs={"options": 1}),  # computes else
            submit_joinable(t, fn, ["u2"], urgent=True, fits=lambda a, b: False),  # no room
            submit_joinable(t, other, ["u3"], urgent=True),  # another model
            submit_joinable(t, fn, ["u4"], urgent=True, fits=lambda a, b: 1 / 0)]  # broken
    gate.set()
    await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 10)
    assert log == ["running", ("u1",), ("u2",), ("u3",), ("u4",), ("r1",), ("r2",)]
    assert all(j.joined is None for j in jobs)
    t.close()


async def test_a_joined_calls_error_reaches_both_callers_and_the_thread_goes_on():
    log: list = []
    t = ModelThread()
    fn = model_fn(log)
    _, gate = await held_open(t, log, "running")
    regular = submit_joinable(t, fn, ["boom"])
    urgent = submit_joinable(t, fn, ["a"], urgent=True)
    gate.set()
    for job in (urgent, regular):
        with pytest.raises(ValueError, match="model exploded"):
            await asyncio.wait_for(job.future, 10)
    assert log == ["running", ("a", "boom")]
    assert await submit_joinable(t, fn, ["x"], urgent=True).future == ["x:1"]
    t.close()


async def test_a_caller_whose_loop_is_gone_is_not_told_and_the_thread_goes_on():
    t = ModelThread()

    def gone():
        raise RuntimeError("Event loop is closed")

    first = t.submit(lambda: 1, began=gone)
    assert await asyncio.wait_for(first.future, 10) == 1
    assert await asyncio.wait_for(t(lambda: 2), 10) == 2
    t.close()
