"""BatchExecutor: one result per request, failures contained, results early."""

import asyncio
import threading

import pytest

from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput
from tests.integration.pipeline_setup import until
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder, FakeReranker


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
                       inline=True)
    reqs = [req(i, [f"a b {i}", "c"]) for i in range(5)]
    steps = await collect(ex, batch(reqs))
    results = [r for s in steps for r in s]
    assert sorted(r.id for r in results) == [f"r{i}" for i in range(5)]
    assert all(r.status == "ok" and len(r.embeddings) == 2 for r in results)
    assert results[0].embeddings[0] == model.encode(["a b 0"]).vectors[0].tolist()
    assert len(steps) > 1  # published in several steps, not all at the end


async def test_each_result_says_whether_its_batch_was_express():
    """A replay leaves express batches out of Jain's index: the flag must reach the result."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", max_padded_tokens=8, max_size=2,
                       inline=True)
    for express in (True, False):
        b = Batch(id="b", endpoint="e", requests=[req(i) for i in range(3)], tokens=9,
                  created_ms=3, express=express)
        results = [r for s in await collect(ex, b) for r in s]
        assert len(results) == 3
        assert [r.express for r in results] == [express] * 3


async def test_first_chosen_requests_come_back_first():
    """With order kept by window, the first request's result precedes the last one's."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", max_padded_tokens=4, max_size=1,
                       window=1, inline=True)
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
                       inline=True)
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

    ex = BatchExecutor(Picky(), "embed", worker="w", inline=True)
    steps = await collect(ex, batch([req(0), req(1, ["poison pill"]), req(2)]))
    by_id = {r.id: r for s in steps for r in s}
    assert by_id["r1"].status == "failed" and "poison" in by_id["r1"].message
    assert by_id["r0"].status == by_id["r2"].status == "ok"


async def test_wrong_kind_and_expired_are_answered():
    """A rerank input on an embed endpoint is invalid; a passed deadline is expired."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", inline=True)
    steps = await collect(ex, batch([req(0, rerank=("q", ["d"])), req(1, deadline=5), req(2)]))
    by_id = {r.id: r for s in steps for r in s}
    assert by_id["r0"].status == "invalid" and by_id["r0"].reason == "wrong_input_kind"
    assert by_id["r1"].status == "expired"
    assert by_id["r2"].status == "ok"


async def test_truncation_is_reported_per_text():
    """A text longer than the model reads is flagged, its neighbour is not."""
    ex = BatchExecutor(FakeEmbedder(max_seq_length=4), "embed", worker="w", inline=True)
    steps = await collect(ex, batch([req(0, ["a b c d e f", "a b"])]))
    assert steps[0][0].truncated == [True, False]


async def test_rerank_scores_and_ranking():
    """Rerank gives one score per document and a best-first ranking cut to top_n."""
    ex = BatchExecutor(FakeReranker(), "rerank", worker="w", inline=True)
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


class Gated(FakeEmbedder):
    """A model that takes time: a call whose first text is in ``hold`` waits there until
    the test opens the gate (in the model's thread, as a GPU call would)."""

    instant = False

    def __init__(self, hold=()):
        super().__init__()
        self.hold = set(hold)
        self.gate = threading.Event()
        self.calls: list[str] = []
        #: Every call's texts, whole.
        self.texts: list[list[str]] = []

    def encode(self, texts, *, lengths=None):
        self.calls.append(texts[0])
        self.texts.append(list(texts))
        if texts[0] in self.hold:
            assert self.gate.wait(10), "the test never opened the gate"
        return super().encode(texts, lengths=lengths)


def queued(ex) -> list:
    """The calls waiting in the executor's model thread."""
    return list(ex._thread._queue)


async def test_two_batches_in_hand_take_the_model_in_turn_and_release_when_they_get_it():
    """A batch's credit returns as its last call gets the model, not while it waits for it.

    Two batches are served at once (the worker overlaps them); the first
    one's model call is held open. The second must neither call the model
    nor return its credit until the first is done.
    """
    released: list[str] = []
    model = Gated(hold={"first"})
    ex = BatchExecutor(model, "embed", worker="w",
                       on_release=lambda b, expect_s: released.append(b.id))
    one = Batch(id="b1", endpoint="e", requests=[req(1, ["first"])], tokens=3, created_ms=3)
    two = Batch(id="b2", endpoint="e", requests=[req(2, ["second"])], tokens=3, created_ms=3)
    first = asyncio.create_task(collect(ex, one))
    second = asyncio.create_task(collect(ex, two))
    await until(lambda: model.calls == ["first"] and len(queued(ex)) == 1,
                "b1's call in the model and b2's waiting for it", timeout_s=10)
    await asyncio.sleep(0.05)  # b2's call waits: its credit must not return meanwhile
    assert released == ["b1"], "the waiting batch returned its credit before it had the model"
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert model.calls == ["first", "second"] and released == ["b1", "b2"]
    ex.close()


async def test_the_next_batch_is_handed_to_the_model_before_the_last_ones_call_ends():
    """While a call runs, a waiting batch's call is already in the model's thread.

    It starts the moment the running call ends, not once the event loop has
    seen that end and handled its results (built, encoded, handed to the
    producer): the model would sit idle meanwhile.
    """
    model = Gated(hold={"first"})
    ex = BatchExecutor(model, "embed", worker="w")
    one = Batch(id="b1", endpoint="e", requests=[req(1, ["first"])], tokens=3, created_ms=3)
    two = Batch(id="b2", endpoint="e", requests=[req(2, ["second"])], tokens=3, created_ms=3)
    first = asyncio.create_task(collect(ex, one))
    second = asyncio.create_task(collect(ex, two))
    await until(lambda: model.calls == ["first"] and len(queued(ex)) == 1,
                "b2's call handed to the model's thread while b1's runs", timeout_s=10)
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert model.calls == ["first", "second"]
    ex.close()


async def test_a_batchs_next_micro_batch_is_handed_over_while_the_one_before_runs():
    """Within one batch too: micro-batch n + 1 waits in the model's thread while n runs.

    With one batch in hand (most of the time at a saturated worker whose
    next batch is still on its way), a micro-batch handed over only after
    the previous one's end had reached the event loop left the model idle
    for the loop's latency and the previous results' handling.
    """
    model = Gated(hold={"first"})
    ex = BatchExecutor(model, "embed", worker="w", max_size=1)
    both = Batch(id="b", endpoint="e", requests=[req(1, ["first"]), req(2, ["second"])],
                 tokens=6, created_ms=3)
    task = asyncio.create_task(collect(ex, both))
    await until(lambda: model.calls == ["first"] and len(queued(ex)) == 1,
                "the second micro-batch handed over while the first runs", timeout_s=10)
    waiting = queued(ex)[0]
    assert waiting.follows is not None and waiting.key is None, \
        "the next micro-batch was not handed over as the running call's continuation"
    model.gate.set()
    steps = await asyncio.wait_for(task, 10)
    assert model.calls == ["first", "second"]
    assert [[r.id for r in step] for step in steps] == [["r1"], ["r2"]]
    ex.close()


async def test_a_micro_batch_handed_over_early_queues_behind_a_newer_batchs_call():
    """A continuation takes its place when the call before it ends.

    Batch A has two micro-batches; A's second is handed over as A's first
    begins. Batch B's call, handed over while A's first runs, goes first: a
    quiet request at the head of a newer batch is not put behind the rest
    of an older one.
    """
    model = Gated(hold={"a0"})
    ex = BatchExecutor(model, "embed", worker="w", max_size=1)
    a = Batch(id="a", endpoint="e", requests=[req(1, ["a0"]), req(2, ["a1"])], tokens=6,
              created_ms=3)
    b = Batch(id="b", endpoint="e", requests=[req(3, ["b0"])], tokens=3, created_ms=3)
    first = asyncio.create_task(collect(ex, a))
    await until(lambda: model.calls == ["a0"] and len(queued(ex)) == 1,
                "A's second micro-batch handed over while its first runs", timeout_s=10)
    second = asyncio.create_task(collect(ex, b))
    await until(lambda: len(queued(ex)) == 2, "B's call handed over", timeout_s=10)
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert model.calls == ["a0", "b0", "a1"], model.calls
    ex.close()


async def test_a_batch_left_early_cancels_its_waiting_calls():
    """A consumer that stops reading a batch's results leaves no call behind."""
    model = Gated(hold={"t1"})
    ex = BatchExecutor(model, "embed", worker="w", max_size=1)
    three = Batch(id="b", endpoint="e", requests=[req(i, [f"t{i}"]) for i in range(3)],
                  tokens=9, created_ms=3)
    steps = ex.serve(three)
    first = await asyncio.wait_for(anext(steps), 10)
    assert [s.result.id for s in first] == ["r0"]
    await until(lambda: model.calls == ["t0", "t1"] and len(queued(ex)) == 1,
                "t1 in the model, t2 waiting for it", timeout_s=10)
    await steps.aclose()
    model.gate.set()
    # Two calls handed over one after the other: once the second has run,
    # everything ahead of it (t2, had it not been dropped) has been taken.
    for _ in range(2):
        await ex._model_call(lambda: None)
    assert model.calls == ["t0", "t1"], model.calls  # t2 never ran
    assert not queued(ex), "a call of a batch left early is still waiting for the model"
    ex.close()


async def test_the_last_call_is_announced_with_its_expected_time_once_calls_are_measured():
    """No estimate before any call is measured; then the rate measured so far times its
    size; a small call (mostly fixed cost) the small calls' average once one is measured,
    or the rate's figure where that is larger."""
    told: list[tuple[float | None, float | None, float | None]] = []
    # 5 ms a call besides 0.5 ms a padded token: a call of 2 tokens is mostly fixed cost.
    ex = BatchExecutor(FakeEmbedder(ms_per_token=0.5, ms_per_batch=5), "embed", worker="w",
                       max_padded_tokens=16, max_size=4, inline=True,
                       on_release=lambda b, expect_s: told.append(
                           (expect_s, ex.seconds_per_padded_token, ex.seconds_per_small_call)))
    four_words = ["one two three four"]
    await collect(ex, batch([req(i, four_words) for i in range(4)]))  # one call of 4 x 4
    assert told == [(None, None, None)]
    small_batch = [req(i, four_words) for i in range(4)] + [req(9, ["one two"])]
    await collect(ex, batch(small_batch))
    # Two calls: 4 x 4 tokens (measured), then 1 x 2 tokens: no small call measured
    # yet, so the rate's figure for its 2 padded tokens.
    expect_s, rate, small = told[1]
    assert small is None and rate is not None and rate > 0
    assert expect_s == pytest.approx(rate * 2)
    assert ex.seconds_per_small_call is not None  # that call is measured now
    await collect(ex, batch([req(i, four_words) for i in range(8)]))
    # Two calls of 4 x 4: the last one's estimate is the rate measured before it, x 16.
    expect_s, rate, _ = told[2]
    assert expect_s == pytest.approx(rate * 16)
    await collect(ex, batch(small_batch))
    expect_s, rate, small = told[3]
    assert small is not None
    assert expect_s == pytest.approx(max(small, rate * 2))
    assert expect_s > 2 * rate * 2  # the fixed cost the rate leaves out is counted


async def test_texts_of_no_tokens_are_served_and_leave_the_estimate_alone():
    """Empty texts pad to nothing: served ok, no rate measured from a call of 0 tokens."""
    ex = BatchExecutor(FakeEmbedder(), "embed", worker="w", max_padded_tokens=16, max_size=4,
                       inline=True)
    steps = await collect(ex, batch([req(i, [""]) for i in range(4)]))
    assert sorted(r.id for s in steps for r in s) == ["r0", "r1", "r2", "r3"]
    assert all(r.status == "ok" for s in steps for r in s)
    assert ex.seconds_per_padded_token is None


async def test_the_credit_is_due_at_the_first_call_the_lead_covers_the_rest_of():
    """Two calls of 4 x 4 tokens (1.6 ms each): at a 10 ms round trip (lead 25 ms) the
    second one's time is covered, so the credit is announced as the first call starts,
    with both calls' time; with no round trip known, as the second starts, with its own.
    (``told`` holds the time in padded tokens at the rate measured then.)"""
    calls: list[int] = []
    told: list[tuple[int, float | None]] = []

    class Counting(FakeEmbedder):
        def encode(self, texts, **kwargs):
            calls.append(len(texts))
            return super().encode(texts, **kwargs)

    ex = BatchExecutor(Counting(ms_per_token=0.1), "embed", worker="w", max_padded_tokens=16,
                       max_size=4, inline=True,
                       on_release=lambda b, expect_s: told.append(
                           (len(calls), expect_s and expect_s / ex.seconds_per_padded_token)))
    four_words = ["one two three four"]
    await collect(ex, batch([req(i, four_words) for i in range(4)]))  # measures the rate
    told.clear()
    calls.clear()
    b = Batch(id="b", endpoint="e", requests=[req(i, four_words) for i in range(8)],
              tokens=24, created_ms=3, round_trip_ms=10.0)
    await collect(ex, b)
    assert calls == [4, 4]
    # As call 0 starts, the time of both calls' 32 padded tokens at the rate measured.
    assert told == [(0, pytest.approx(32))]
    told.clear()
    calls.clear()
    await collect(ex, batch([req(i, four_words) for i in range(8)]))  # no round trip known
    assert told == [(1, pytest.approx(16))]  # as call 1 starts: its own 16


async def test_a_batch_is_cut_where_a_call_more_costs_less_than_its_padding():
    """Three texts of 1 word and one of 30 (fake tokens: a word each): filled, one call pads
    to 4 x 30; told a call is worth 10 tokens (or having learned it), the long text runs
    alone. The calls' padded tokens also teach the executor what a call is worth."""
    sizes: list[list[int]] = []

    class Counting(FakeEmbedder):
        def encode(self, texts, **kwargs):
            sizes.append(sorted(len(t.split()) for t in texts))
            return super().encode(texts, **kwargs)

    texts = [["a"], ["b"], ["c"], ["w " * 30]]

    async def calls(ex):
        sizes.clear()
        await collect(ex, batch([req(i, t) for i, t in enumerate(texts)]))
        return sorted(sizes)

    kw = {"worker": "w", "max_padded_tokens": 4096, "max_size": 8, "inline": True}
    assert await calls(BatchExecutor(Counting(), "embed", **kw, call_tokens=0)) == [
        [1, 1, 1, 30]]
    assert await calls(BatchExecutor(Counting(), "embed", **kw, call_tokens=10)) == [
        [1, 1, 1], [30]]
    assert await calls(BatchExecutor(Counting(), "embed", **kw)) == [
        [1, 1, 1, 30]]  # nothing learned yet: filled
    learned = BatchExecutor(Counting(), "embed", **kw)
    for padded in (40, 400, 1000, 120, 3000, 60, 800, 2000):  # 1 ms + 0.1 ms a token
        learned.call_cost.observe(padded, 0.001 + 0.0001 * padded)
    assert learned.call_tokens() == pytest.approx(10, rel=0.01)
    assert await calls(learned) == [[1, 1, 1], [30]]


async def test_the_calls_made_teach_the_executor_what_a_call_is_worth():
    """Calls of 1 ms + 0.05 ms a padded token (a call worth 20 tokens), of several sizes:
    once measured, the executor has a fit with a fixed cost and a token cost."""
    ex = BatchExecutor(FakeEmbedder(ms_per_batch=1, ms_per_token=0.05), "embed", worker="w",
                       max_padded_tokens=400, max_size=8, inline=True, call_tokens=0)
    assert ex.call_cost.fit() is None
    for words in (2, 10, 40, 5, 25, 60, 3, 15):
        await collect(ex, batch([req(i, ["w " * words]) for i in range(4)]))
    assert ex.call_cost.fit() is not None
    assert 0 < ex.call_cost.call_tokens() < 400
