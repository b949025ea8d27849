"""BatchExecutor: one result per request, failures contained, results early."""

import asyncio
import threading

import pytest

from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder, FakeReranker


async def _inline(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def req(i, texts=None, *, rerank=None, deadline=None, org="a"):
    inp = RerankInput(query=rerank[0], documents=rerank[1]) if rerank else EmbedInput(
        texts=texts or [f"text number {i}"])
    return AdmittedRequest(id=f"r{i}", org=org, endpoint="e", tier="t", input=inp, tokens=3,
                           deadline_at_ms=deadline, created_ms=1, admitted_ms=2,
                           reply_to="sf.results")


def batch(reqs):
    return Batch(id="b", endpoint="e", requests=reqs, tokens=3 * len(reqs), created_ms=3)


async def collect(ex, b):
    steps = []
    async for done in ex.serve(b):
        steps.append([s.result for s in done])
    return steps


async def test_every_request_gets_one_ok_result_with_vectors():
    """Each embed request comes back once, with one normalized vector per text."""
    model = FakeEmbedder(dim=8)
    ex = BatchExecutor(model, "embed", worker="w", max_padded_tokens=8, max_size=2,
                       run_in_thread=_inline)
    reqs = [req(i, [f"a b {i}", "c"]) for i in range(5)]
    steps = await collect(ex, batch(reqs))
    results = [r for s in steps for r in s]
    assert sorted(r.id for r in results) == [f"r{i}" for i in range(5)]
    assert all(r.status == "ok" and len(r.embeddings) == 2 for r in results)
    assert results[0].embeddings[0] == model.encode(["a b 0"]).vectors[0].tolist()
    assert len(steps) > 1  # published in several steps, not all at the end


async def test_first_chosen_requests_come_back_first():
    """With order kept by window, the first request's result precedes the last one's."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", max_padded_tokens=4, max_size=1,
                       window=1, run_in_thread=_inline)
    steps = await collect(ex, batch([req(i, ["x " * (10 - i)]) for i in range(4)]))
    assert [s[0].id for s in steps] == ["r0", "r1", "r2", "r3"]


async def test_a_quiet_request_ahead_of_a_burst_comes_back_from_a_call_of_its_own():
    """One quiet org's request, then 40 of a bulk org's: its result is the first step, alone."""
    calls: list[int] = []

    class Counting(FakeEmbedder):
        def encode(self, texts, **kwargs):
            calls.append(len(texts))
            return super().encode(texts, **kwargs)

    ex = BatchExecutor(Counting(), "embed", worker="w", max_padded_tokens=4096, max_size=16,
                       run_in_thread=_inline)
    reqs = [req(0, org="quiet")] + [req(i, org="bulk") for i in range(1, 41)]
    steps = await collect(ex, batch(reqs))
    assert [r.id for r in steps[0]] == ["r0"]
    assert calls == [1, 16, 16, 8]


async def test_bad_request_fails_alone():
    """A text the model chokes on fails its request only; the rest of the batch is ok."""

    class Picky(FakeEmbedder):
        def encode(self, texts, *, lengths=None):
            if any("poison" in t for t in texts):
                raise RuntimeError("cannot embed poison")
            return super().encode(texts, lengths=lengths)

    ex = BatchExecutor(Picky(), "embed", worker="w", run_in_thread=_inline)
    steps = await collect(ex, batch([req(0), req(1, ["poison pill"]), req(2)]))
    by_id = {r.id: r for s in steps for r in s}
    assert by_id["r1"].status == "failed" and "poison" in by_id["r1"].message
    assert by_id["r0"].status == by_id["r2"].status == "ok"


async def test_wrong_kind_and_expired_are_answered():
    """A rerank input on an embed endpoint is invalid; a passed deadline is expired."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", run_in_thread=_inline)
    steps = await collect(ex, batch([req(0, rerank=("q", ["d"])), req(1, deadline=5), req(2)]))
    by_id = {r.id: r for s in steps for r in s}
    assert by_id["r0"].status == "invalid" and by_id["r0"].reason == "wrong_input_kind"
    assert by_id["r1"].status == "expired"
    assert by_id["r2"].status == "ok"


async def test_truncation_is_reported_per_text():
    """A text longer than the model reads is flagged, its neighbour is not."""
    ex = BatchExecutor(FakeEmbedder(max_seq_length=4), "embed", worker="w", run_in_thread=_inline)
    steps = await collect(ex, batch([req(0, ["a b c d e f", "a b"])]))
    assert steps[0][0].truncated == [True, False]


async def test_rerank_scores_and_ranking():
    """Rerank gives one score per document and a best-first ranking cut to top_n."""
    ex = BatchExecutor(FakeReranker(), "rerank", worker="w", run_in_thread=_inline)
    r = req(0, rerank=("red apple", ["blue sky", "red apple pie", "apple"]))
    r.input.top_n = 2
    steps = await collect(ex, batch([r]))
    res = steps[0][0]
    assert res.status == "ok" and len(res.scores) == 3 and res.ranking[0] == 1
    assert len(res.ranking) == 2 and res.method == "cosine"


async def test_runs_in_a_thread_by_default():
    """The default runner keeps the event loop free while the model computes."""
    entered, gate = threading.Event(), threading.Event()

    class Gated(FakeEmbedder):
        """Computes only once the event loop opens the gate: impossible if it blocks the loop."""

        instant = False  # it takes time, as a real model does

        def encode(self, texts, *, lengths=None):
            self.thread = threading.get_ident()
            entered.set()
            self.opened = gate.wait(timeout=10)
            return super().encode(texts, lengths=lengths)

    model = Gated()
    ex = BatchExecutor(model, "embed", worker="w")
    serving = asyncio.create_task(collect(ex, batch([req(0)])))
    assert await asyncio.to_thread(entered.wait, 10), "the model was never called"
    gate.set()  # the loop runs while the model is inside encode
    steps = await asyncio.wait_for(serving, 10)
    assert model.opened, "encode blocked the event loop until its own timeout"
    assert model.thread != threading.get_ident()
    assert [r.status for s in steps for r in s] == ["ok"]


async def test_two_batches_in_hand_take_the_model_in_turn_and_release_when_they_get_it():
    """A batch's credit returns as its last call gets the model, not while it waits for it.

    Two batches are served at once (the worker overlaps them); the first
    one's model call is held open. The second must neither call the model
    nor return its credit until the first is done.
    """
    gate = asyncio.Event()
    calls: list[str] = []
    released: list[str] = []
    inside = 0

    class Timed(FakeEmbedder):
        instant = False  # it takes time, as a real model does

    model = Timed()

    async def runner(fn, *args, **kwargs):
        nonlocal inside
        if fn != model.encode:  # token counting: not a model call
            return fn(*args, **kwargs)
        inside += 1
        assert inside == 1, "two model calls at once"
        calls.append(args[0][0])
        if len(calls) == 1:
            await gate.wait()
        inside -= 1
        return fn(*args, **kwargs)

    ex = BatchExecutor(model, "embed", worker="w", run_in_thread=runner,
                       on_last_step=lambda b, expect_s: released.append(b.id))
    one = Batch(id="b1", endpoint="e", requests=[req(1, ["first"])], tokens=3, created_ms=3)
    two = Batch(id="b2", endpoint="e", requests=[req(2, ["second"])], tokens=3, created_ms=3)
    first = asyncio.create_task(collect(ex, one))
    second = asyncio.create_task(collect(ex, two))
    for _ in range(50):  # let both run as far as they can
        await asyncio.sleep(0)
    assert calls == ["first"], calls
    assert released == ["b1"], "the waiting batch returned its credit before it had the model"
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert calls == ["first", "second"] and released == ["b1", "b2"]


async def test_the_next_batch_gets_the_model_before_the_last_ones_results_are_handled():
    """A call's end hands the model to the call waiting for it, then its results are handled.

    The results of a call (built, encoded, handed to the producer) take the
    event loop for a while; a waiting batch that starts its call only after
    them leaves the model idle meanwhile.
    """
    gate = asyncio.Event()
    events: list[str] = []

    class Timed(FakeEmbedder):
        instant = False  # it takes time, as a real model does

    model = Timed()

    async def runner(fn, *args, **kwargs):
        if fn == model.encode:
            events.append(f"call {args[0][0]}")
            if args[0][0] == "first":
                await gate.wait()
        return fn(*args, **kwargs)

    async def handle(b: Batch) -> None:
        async for _ in ex.serve(b):
            events.append(f"results {b.id}")

    ex = BatchExecutor(model, "embed", worker="w", run_in_thread=runner)
    one = Batch(id="b1", endpoint="e", requests=[req(1, ["first"])], tokens=3, created_ms=3)
    two = Batch(id="b2", endpoint="e", requests=[req(2, ["second"])], tokens=3, created_ms=3)
    first = asyncio.create_task(handle(one))
    second = asyncio.create_task(handle(two))
    for _ in range(50):  # both as far as they can: b1 in its call, b2 waiting for the model
        await asyncio.sleep(0)
    assert events == ["call first"], events
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert events == ["call first", "call second", "results b1", "results b2"], events


async def test_a_batchs_next_micro_batch_gets_the_model_before_the_last_ones_results_are_handled():
    """Within one batch too: micro-batch n + 1 waits for the model while n runs.

    With one batch in hand (most of the time at a saturated worker whose
    next batch is still on its way), a next micro-batch asked for only after
    the previous one's results were handled left the model idle for as long
    as they took.
    """
    gate = asyncio.Event()
    events: list[str] = []

    class Timed(FakeEmbedder):
        instant = False  # it takes time, as a real model does

    model = Timed()

    async def runner(fn, *args, **kwargs):
        if fn == model.encode:
            events.append(f"call {args[0][0]}")
            if args[0][0] == "first":
                await gate.wait()
        return fn(*args, **kwargs)

    ex = BatchExecutor(model, "embed", worker="w", run_in_thread=runner, max_size=1)
    both = Batch(id="b", endpoint="e", requests=[req(1, ["first"]), req(2, ["second"])],
                 tokens=6, created_ms=3)

    async def handle() -> None:
        async for done in ex.serve(both):
            events.append(f"results {[s.result.id for s in done]}")

    task = asyncio.create_task(handle())
    for _ in range(50):  # the first call holds the model, the second waits for it
        await asyncio.sleep(0)
    assert events == ["call first"], events
    gate.set()
    await asyncio.wait_for(task, 10)
    assert events == ["call first", "call second", "results ['r1']", "results ['r2']"], events


async def test_a_micro_batch_asked_at_the_end_of_the_last_queues_behind_a_waiting_batch():
    """Asking at the end of the call before keeps the order calls asked in.

    Batch A has two micro-batches; batch B's call waits while A's first
    runs. A's second asks as A's first ends, so B's (asked earlier) goes
    first: a quiet request at the head of a newer batch is not put behind
    the rest of an older one.
    """
    gate = asyncio.Event()
    events: list[str] = []

    class Timed(FakeEmbedder):
        instant = False

    model = Timed()

    async def runner(fn, *args, **kwargs):
        if fn == model.encode:
            events.append(f"call {args[0][0]}")
            if args[0][0] == "a0":
                await gate.wait()
        return fn(*args, **kwargs)

    ex = BatchExecutor(model, "embed", worker="w", run_in_thread=runner, max_size=1)
    a = Batch(id="a", endpoint="e", requests=[req(1, ["a0"]), req(2, ["a1"])], tokens=6,
              created_ms=3)
    b = Batch(id="b", endpoint="e", requests=[req(3, ["b0"])], tokens=3, created_ms=3)
    first = asyncio.create_task(collect(ex, a))
    for _ in range(20):
        await asyncio.sleep(0)
    second = asyncio.create_task(collect(ex, b))
    for _ in range(20):
        await asyncio.sleep(0)
    assert events == ["call a0"], events
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert events == ["call a0", "call b0", "call a1"], events


async def test_a_batch_left_early_cancels_its_waiting_calls():
    """A consumer that stops reading a batch's results leaves no call behind."""
    gate = asyncio.Event()
    calls: list[str] = []

    class Timed(FakeEmbedder):
        instant = False

    model = Timed()

    async def runner(fn, *args, **kwargs):
        if fn == model.encode:
            calls.append(args[0][0])
            if args[0][0] != "t0":
                await gate.wait()  # never set: the second call holds the model
        return fn(*args, **kwargs)

    ex = BatchExecutor(model, "embed", worker="w", run_in_thread=runner, max_size=1)
    three = Batch(id="b", endpoint="e", requests=[req(i, [f"t{i}"]) for i in range(3)],
                  tokens=9, created_ms=3)
    steps = ex.serve(three)
    first = await asyncio.wait_for(anext(steps), 10)
    assert [s.result.id for s in first] == ["r0"]
    for _ in range(20):  # the one call ahead reaches the model
        await asyncio.sleep(0)
    assert calls == ["t0", "t1"], calls
    await steps.aclose()
    for _ in range(20):
        await asyncio.sleep(0)
    assert calls == ["t0", "t1"], calls  # the third was never asked for
    assert not ex._model_lock.locked(), "a call of a batch left early still holds the model"


async def test_the_last_call_is_announced_with_its_expected_time_once_calls_are_measured():
    """No estimate before any call is measured; then the rate measured so far times its size."""
    told: list[tuple[float | None, float | None]] = []
    ex = BatchExecutor(FakeEmbedder(ms_per_token=0.5), "embed", worker="w",
                       max_padded_tokens=16, max_size=4, run_in_thread=_inline,
                       on_last_step=lambda b, expect_s: told.append(
                           (expect_s, ex.seconds_per_padded_token)))
    four_words = ["one two three four"]
    await collect(ex, batch([req(i, four_words) for i in range(4)]))  # one call of 4 x 4
    assert told == [(None, None)]
    await collect(ex, batch([req(i, four_words) for i in range(4)] + [req(9, ["one two"])]))
    # Two calls: 4 x 4 tokens (measured), then 1 x 2 tokens: too small to estimate.
    assert told[1][0] is None
    await collect(ex, batch([req(i, four_words) for i in range(8)]))
    # Two calls of 4 x 4: the last one's estimate is the rate measured before it, x 16.
    expect_s, rate = told[2]
    assert rate is not None and rate > 0
    assert expect_s == pytest.approx(rate * 16)


async def test_texts_of_no_tokens_are_served_and_leave_the_estimate_alone():
    """Empty texts pad to nothing: served ok, no rate measured from a call of 0 tokens."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", max_padded_tokens=16, max_size=4,
                       run_in_thread=_inline)
    steps = await collect(ex, batch([req(i, [""]) for i in range(4)]))
    assert sorted(r.id for s in steps for r in s) == ["r0", "r1", "r2", "r3"]
    assert all(r.status == "ok" for s in steps for r in s)
    assert ex.seconds_per_padded_token is None
