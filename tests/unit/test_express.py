"""Express batches: a quiet org that comes in under a burst does not wait for the queued batch.

The pure parts, each on its own: the DRR ring's fresh orgs (scheduler/drr.py),
the lane's express batch (scheduler/lane.py), the express claim
(scheduler/flow.py), the dispatcher putting them together
(scheduler/dispatch.py), the model thread's urgent calls
(worker/model_thread.py), the executor handing an express batch's first call
over as urgent, for embeddings and reranking (worker/execute.py), and an
express batch's head (worker/microbatch.py).
"""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings
from scheduler.core import Scheduler
from scheduler.dispatch import Dispatcher
from scheduler.drr import DrrTier
from scheduler.entry import Entry
from scheduler.flow import FlowControl
from scheduler.service import SchedulerService
from scheduler.snapshot import Backlog
from schemas.build import build_config
from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput, WorkerEvent
from tests.integration.pipeline_setup import until
from tests.unit.test_model_thread import gated, held_open
from tests.unit.test_worker_execute import Gated
from worker.execute import BatchExecutor
from worker.interface import CosineReranker
from worker.microbatch import plan_with_head
from worker.model_thread import ModelThread

CONFIG = build_config(worker_slots=4, orgs={"bulk": "free", "quiet": "free", "calm": "free"},
                      endpoints={"embed": {"quantum": 4, "max_batch_tokens": 8,
                                           "max_batch_size": 4, "max_request_tokens": 4}}).config


def _entry(i: int, org: str, tokens: int = 2) -> Entry:
    req = AdmittedRequest(id=f"r{i}", org=org, endpoint="embed", tier="free",
                          input=EmbedInput(texts=("x",)), tokens=tokens, created_ms=1,
                          admitted_ms=1, reply_to="sf.results")
    return Entry(req.id, org, "free", tokens, arrival=i, payload=req)


def _cost(e: Entry) -> float:
    return float(e.tokens)


# -- the ring's fresh orgs -----------------------------------------------------


def test_an_org_is_fresh_from_joining_until_first_served():
    t = DrrTier(quantum=4, weight_of=lambda org: 1.0)
    for i in range(3):
        t.push(_entry(i, "bulk"))
    q, e, c = t.peek(_cost)
    t.take(q, e, c)
    assert list(t.fresh) == []                       # bulk was served: not fresh
    t.push(_entry(10, "quiet"))
    t.push(_entry(11, "quiet"))
    assert list(t.fresh) == ["quiet"]
    q, e, c = t.peek_fresh(_cost)
    assert (q.org, e.id) == ("quiet", "r10")
    t.take(q, e, c)
    assert list(t.fresh) == [] and t.peek_fresh(_cost) is None
    assert t.orgs["quiet"].deficit == -2             # charged ahead of its turn
    assert t.live == 3


def test_an_org_emptied_by_an_express_take_leaves_the_ring_from_its_middle():
    t = DrrTier(quantum=4, weight_of=lambda org: 1.0)
    t.push(_entry(0, "bulk"))
    t.push(_entry(1, "quiet"))
    t.push(_entry(2, "calm"))
    q, e, c = t.peek_fresh(_cost)
    assert q.org == "bulk"                           # every joiner is fresh, in order
    t.take(*t.peek(_cost))                           # bulk served by the ring: not fresh
    q, e, c = t.peek_fresh(_cost)
    assert q.org == "quiet"
    t.take(q, e, c)
    assert "quiet" not in t.orgs and [x.org for x in t.ring] == ["calm"]
    # It comes back fresh.
    t.push(_entry(3, "quiet"))
    assert list(t.fresh) == ["calm", "quiet"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "take", "fresh"]),
                          st.sampled_from(["bulk", "quiet", "calm"])), max_size=60))
def test_every_request_leaves_the_ring_once_whatever_mix_of_turns_and_express_takes(ops):
    """Nothing lost, nothing twice: pushes, regular takes and express takes in any order."""
    t = DrrTier(quantum=4, weight_of=lambda org: 1.0)
    pushed, taken = [], []
    for n, (op, org) in enumerate(ops):
        if op == "push":
            e = _entry(n, org)
            t.push(e)
            pushed.append(e.id)
        else:
            pick = t.peek(_cost) if op == "take" else t.peek_fresh(_cost)
            if pick is not None:
                t.take(*pick)
                taken.append(pick[1].id)
    while (pick := t.peek(_cost)) is not None:
        t.take(*pick)
        taken.append(pick[1].id)
    assert sorted(taken) == sorted(pushed) and len(set(taken)) == len(taken)
    assert t.live == 0 and not t.ring and not t.orgs and not t.fresh


# -- the dispatcher ------------------------------------------------------------


def _setup(policy="drr", express=True, express_fill=0.5):
    core = Scheduler(CONFIG, policy)
    flow = FlowControl(10_000, mode="credit", full_batch_tokens={"embed": 8})
    backlog = Backlog()
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0, 1],
                             slots=4, free_slots=4, sent_ms=1000), 1000)
    return core, flow, backlog, Dispatcher(core, flow, backlog, instance="s1", express=express,
                                           express_fill=express_fill)


def _hold(core, backlog, entries):
    for e in entries:
        core.push("embed", e)
        backlog.add("embed", e.tier, e.org, e.tokens)


def _dispatch(disp, now=1.0):
    return list(disp.batches(now, may=lambda: True, on_expired=list))


def test_a_quiet_org_under_a_burst_goes_out_alone_in_an_express_batch():
    core, flow, backlog, disp = _setup()
    _hold(core, backlog, [_entry(i, "bulk") for i in range(12)])
    first = _dispatch(disp)
    # Not measured yet: one batch at a time, so the credit is spent.
    assert [len(o.entries) for o in first] == [4] and not first[0].batch.express
    assert _dispatch(disp) == []
    _hold(core, backlog, [_entry(20, "quiet"), _entry(21, "quiet"), _entry(30, "calm")])
    out = _dispatch(disp)
    assert len(out) == 1 and out[0].batch.express
    assert [e.id for e in out[0].entries] == ["r20", "r30"]   # one of each fresh org
    assert flow.outstanding(out[0].batch.id) == "w"
    # One express batch at a time per worker: a newcomer now waits.
    _hold(core, backlog, [_entry(40, "quiet")])
    assert core.has_fresh("embed") is False                  # quiet was served, holds r21
    _hold(core, backlog, [_entry(50, "other")])
    assert core.has_fresh("embed") and _dispatch(disp) == []
    # The worker returns the express batch's credit as it starts it: room for the next.
    express_id = out[0].batch.id
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="heartbeat", partitions=[0, 1],
                             slots=4, free_slots=2, sent_ms=1100,
                             in_flight=[first[0].batch.id, express_id],
                             released=[express_id]), 1100)
    again = _dispatch(disp, 1.1)
    assert len(again) == 1 and again[0].batch.express
    # The fresh org's request, then topped up in DRR order to half a full batch's
    # tokens (express_fill 0.5: 4 of 8; the first one's two fresh requests were 4).
    assert [e.id for e in again[0].entries] == ["r50", "r21"]


def test_an_express_batch_is_topped_up_in_drr_order_to_its_fill_and_no_further():
    def express(fill: float) -> list[str]:
        core = Scheduler(CONFIG)
        for i in range(6):
            core.push("embed", _entry(i, "bulk"))
        assert len(core.next_batch("embed", 1.0).batch) == 4   # bulk is served: not fresh
        core.push("embed", _entry(20, "quiet"))
        return [e.id for e in core.next_batch("embed", 1.0, fresh=True, fill=fill).batch]

    assert express(0.0) == ["r20"]                       # the fresh request alone
    assert express(0.5) == ["r20", "r4"]                 # to 4 of 8 tokens
    assert express(0.6) == ["r20", "r4"]                 # 6 would pass 4.8: not taken
    assert express(1.0) == ["r20", "r4", "r5"]           # to the full batch, what is held
    # Nothing fresh: no express batch, whatever the fill (never a regular batch in disguise).
    core = Scheduler(CONFIG)
    for i in range(6):
        core.push("embed", _entry(i, "bulk"))
    core.next_batch("embed", 1.0)
    assert core.next_batch("embed", 1.0, fresh=True, fill=1.0).batch == []
    assert core.held == 2


def test_no_express_batch_while_the_credit_has_room_or_when_switched_off_or_fifo():
    core, _flow, backlog, disp = _setup()
    _hold(core, backlog, [_entry(1, "quiet")])
    out = _dispatch(disp)                                     # room: a regular batch
    assert len(out) == 1 and not out[0].batch.express
    for policy, express in (("drr", False), ("fifo", True)):
        core, _flow, backlog, disp = _setup(policy, express)
        _hold(core, backlog, [_entry(i, "bulk") for i in range(8)])
        assert len(_dispatch(disp)) == 1
        _hold(core, backlog, [_entry(20, "quiet")])
        assert _dispatch(disp) == [], (policy, express)


def _measured(flow, disp, core, backlog, n_bulk: int):
    """The worker measured at 10 ms a token, its round trip 0 (so a batch unreleased spends
    its credit), then a regular batch of ``n_bulk`` bulk requests (2 tokens each) sent."""
    _hold(core, backlog, [_entry(100, "bulk"), _entry(101, "bulk"), _entry(102, "bulk"),
                          _entry(103, "bulk")])
    first = _dispatch(disp)
    assert [len(o.entries) for o in first] == [4]
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="batch_done", partitions=[0, 1],
                             slots=4, free_slots=4, sent_ms=1100, batch_id=first[0].batch.id,
                             batch_tokens=8, service_ms=80.0, held_ms=100.0), 1100)
    assert flow.workers["w"].credit.ms_per_token == 10.0
    _hold(core, backlog, [_entry(110 + i, "bulk") for i in range(n_bulk)])
    sent = _dispatch(disp, 1.1)
    assert [len(o.entries) for o in sent] == [min(n_bulk, 4)]
    return sent[0]


def _done(flow, batch, tokens: int, at_ms: int) -> None:
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="batch_done", partitions=[0, 1],
                             slots=4, free_slots=4, sent_ms=at_ms, batch_id=batch.id,
                             batch_tokens=tokens, service_ms=10.0 * tokens, held_ms=100.0), at_ms)


@pytest.mark.parametrize("horizon", [1.0, 0.0])
def test_no_express_batch_while_a_regular_batch_would_start_within_a_batch_time(horizon):
    """A part-full batch ahead (20 of a full batch's 80 ms): the quiet org's request waits for
    the credit and goes first in the next regular batch, no extra call. ``express_horizon=0``:
    the express batch at once, as before."""
    core, flow, backlog, disp = _setup()
    disp.express_horizon = horizon
    small = _measured(flow, disp, core, backlog, n_bulk=1)
    assert flow.work_ahead_ms(flow.workers["w"]) == 20.0
    assert flow.starts_within("embed", 1.0) and not flow.starts_within("embed", 0.2)
    _hold(core, backlog, [_entry(20, "quiet")])
    out = _dispatch(disp, 1.2)
    if horizon == 0.0:
        assert len(out) == 1 and out[0].batch.express
        assert [e.id for e in out[0].entries] == ["r20"]
        return
    assert out == []                                      # credit spent, no express batch
    _done(flow, small.batch, 2, 1300)
    regular = _dispatch(disp, 1.3)
    assert len(regular) == 1 and not regular[0].batch.express
    assert [e.id for e in regular[0].entries] == ["r20"]
    assert not core.has_fresh("embed")


def test_a_fresh_request_goes_first_in_the_next_regular_batch_not_behind_the_ring():
    """Three orgs hold full turns, two served; a fresh org's request, held while a full batch
    is ahead, rides the next regular batch, ahead of their turns (without the fresh-first
    rule it would wait behind the third org's turn and the first's: DRR's ring)."""
    core, flow, backlog, disp = _setup()
    disp.express_horizon = 1.0
    small = _measured(flow, disp, core, backlog, n_bulk=1)
    _hold(core, backlog, [_entry(200 + i, "bulk") for i in range(8)]
          + [_entry(300 + i, "calm") for i in range(8)]
          + [_entry(400 + i, "busy") for i in range(8)])
    assert _dispatch(disp, 1.2) == []                     # 20 ms ahead: no express batch
    _done(flow, small.batch, 2, 1300)
    full = _dispatch(disp, 1.3)                # one of each fresh org, then bulk's turn
    assert [len(o.entries) for o in full] == [4] and not full[0].batch.express
    assert not core.has_fresh("embed")
    assert flow.work_ahead_ms(flow.workers["w"]) == 80.0 and flow.starts_within("embed", 1.0)
    _hold(core, backlog, [_entry(20, "quiet")])
    assert _dispatch(disp, 1.4) == []
    _done(flow, full[0].batch, 8, 1500)
    nxt = _dispatch(disp, 1.5)
    assert nxt and not nxt[0].batch.express
    assert nxt[0].entries[0].id == "r20" and len(nxt[0].entries) == 4


def test_an_express_batch_while_more_than_a_full_batch_is_ahead():
    """A full batch running, its credit not returned, and one queued: the express batch goes
    out; once the running one returns its credit (a lead from its end), it would not."""
    core, flow, backlog, disp = _setup()
    disp.express_horizon = 1.0
    running = _measured(flow, disp, core, backlog, n_bulk=4)
    flow.sent("w", "queued", 1150, 8)                # as a takeover finds it, say
    w = flow.workers["w"]
    assert flow.work_ahead_ms(w) == 160.0 and not flow.starts_within("embed", 1.0)
    _hold(core, backlog, [_entry(20, "quiet")])
    out = _dispatch(disp, 1.2)
    assert len(out) == 1 and out[0].batch.express and out[0].entries[0].id == "r20"
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="heartbeat", partitions=[0, 1],
                             slots=4, free_slots=1, sent_ms=1250,
                             in_flight=[running.batch.id, "queued", out[0].batch.id],
                             released=[running.batch.id, out[0].batch.id]), 1250)
    assert flow.work_ahead_ms(w) == 80.0 and flow.starts_within("embed", 1.0)


def test_the_default_horizon_keeps_regular_batches_in_drr_order():
    """``express_horizon`` 0 (the default): a fresh org waits for its DRR turn in a regular
    batch, as before the horizon existed (the fresh-first order comes with a horizon)."""
    core, _flow, backlog, disp = _setup()
    assert disp.express_horizon == 0.0
    _hold(core, backlog, [_entry(200 + i, "bulk") for i in range(8)]
          + [_entry(300 + i, "calm") for i in range(8)] + [_entry(20, "quiet")])
    out = _dispatch(disp)
    assert [e.id for e in out[0].entries] == ["r200", "r201", "r300", "r301"]


def test_express_needs_a_free_slot_and_credit_mode():
    flow = FlowControl(10_000, mode="credit", full_batch_tokens={"embed": 8})
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0],
                             slots=1, free_slots=1, sent_ms=1000), 1000)
    flow.sent("w", "b1", 1000, 8)
    assert flow.claim("embed", express=True) is None          # its one slot is taken
    flow = FlowControl(10_000, mode="slots", full_batch_tokens={"embed": 8})
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0],
                             slots=2, free_slots=2, sent_ms=1000), 1000)
    flow.sent("w", "b1", 1000, 8)
    flow.sent("w", "b2", 1000, 8)
    assert flow.claim("embed", express=True) is None


# -- the worker ----------------------------------------------------------------


async def test_an_urgent_call_runs_before_the_calls_waiting_but_after_the_one_running():
    log: list[str] = []
    t = ModelThread()
    a0, gate = await held_open(t, log, "a0")
    b0 = t.submit(gated(log, "b0"))
    a1 = t.submit(gated(log, "a1"), follows=a0)
    e0 = t.submit(gated(log, "e0"), urgent=True)
    f0 = t.submit(gated(log, "f0"), urgent=True)
    gate.set()
    await asyncio.wait_for(asyncio.gather(a0.future, b0.future, a1.future, e0.future,
                                          f0.future), 10)
    assert log == ["a0", "e0", "f0", "b0", "a1"]
    t.close()


def _one(n: int, text: str, kind: str, *, express: bool = False) -> Batch:
    inp = (EmbedInput(texts=(text,)) if kind == "embed"
           else RerankInput(query=text, documents=(f"{text} doc",)))
    req = AdmittedRequest(id=f"r{n}", org=f"o{n}", endpoint="e", tier="free", input=inp,
                          tokens=2, created_ms=1, admitted_ms=1, reply_to="sf.results")
    return Batch(id=f"b{n}", endpoint="e", requests=[req], tokens=2, created_ms=1,
                 express=express)


@pytest.mark.parametrize("kind", ["embed", "rerank"])
async def test_an_express_batchs_first_call_runs_before_a_batch_already_waiting(kind):
    """The call in progress ends first; then the express batch, then the one queued before it
    (embeddings: calls of one text at most, so that the two cannot share a call)."""
    embedder = Gated(hold={"first"})
    model = embedder if kind == "embed" else CosineReranker(embedder, name="gated")
    ex = BatchExecutor(model, kind, worker="w", max_size=1)

    async def serve(b: Batch) -> None:
        async for _ in ex.serve(b):
            pass

    running = asyncio.create_task(serve(_one(1, "first", kind)))
    await until(lambda: embedder.calls == ["first"], "the first batch's call to start",
                timeout_s=10)
    queued = asyncio.create_task(serve(_one(2, "queued", kind)))
    await until(lambda: len(ex._thread._queue) == 1, "the queued batch's call to wait",
                timeout_s=10)
    express = asyncio.create_task(serve(_one(3, "express", kind, express=True)))
    await until(lambda: len(ex._thread._queue) == 2, "the express batch's call to wait",
                timeout_s=10)
    embedder.gate.set()
    await asyncio.wait_for(asyncio.gather(running, queued, express), 10)
    firsts = [c for c in embedder.calls if not c.endswith("doc")]
    assert firsts == ["first", "express", "queued"]
    ex.close()


async def test_an_express_batchs_first_call_shares_the_waiting_call_measured_once():
    """Where the call waiting next has room, the express batch's first call carries its
    texts: one model call for both (its fixed cost paid once), each batch its results,
    the call measured and reported once, its seconds shared by tokens."""
    embedder = Gated(hold={"first"})
    stats: list = []
    ex = BatchExecutor(embedder, "embed", worker="w", on_microbatch=stats.append)
    got: dict[str, list] = {}

    async def serve(b: Batch) -> None:
        got[b.id] = [s.result for step in [x async for x in ex.serve(b)] for s in step]

    running = asyncio.create_task(serve(_one(1, "first", "embed")))
    await until(lambda: embedder.calls == ["first"], "the first batch's call to start",
                timeout_s=10)
    queued = asyncio.create_task(serve(_one(2, "queued", "embed")))
    await until(lambda: len(ex._thread._queue) == 1, "the queued batch's call to wait",
                timeout_s=10)
    express = asyncio.create_task(serve(_one(3, "express", "embed", express=True)))
    await until(lambda: len(ex._thread._queue) == 2, "the express batch's call to wait",
                timeout_s=10)
    embedder.gate.set()
    await asyncio.wait_for(asyncio.gather(running, queued, express), 10)
    assert embedder.texts == [["first"], ["express", "queued"]]
    results = {b: [(r.id, r.status, r.batch_id) for r in rs] for b, rs in got.items()}
    assert results == {"b1": [("r1", "ok", "b1")], "b2": [("r2", "ok", "b2")],
                       "b3": [("r3", "ok", "b3")]}
    # Each result is its own text's vector, not its neighbour's in the shared call.
    alone = embedder.encode(["queued", "express"])
    assert got["b2"][0].embeddings == [alone.vectors[0].tolist()]
    assert got["b3"][0].embeddings == [alone.vectors[1].tolist()]
    # Two calls made, two reported (a token a text), the second as joined.
    assert [(s.tokens, s.joined) for s in stats] == [(1, False), (2, True)]
    shared = [got[b][0].inference_ms for b in ("b2", "b3")]
    assert shared[0] == shared[1] > 0  # one call's time, shared by tokens (one each)
    ex.close()


def test_an_express_batch_runs_what_comes_before_its_largest_org_on_its_own():
    kw = {"max_padded_tokens": 1000, "max_size": 64}
    lengths = [10] * 6
    keys = ["q", "c", "b", "b", "b", "b"]
    assert plan_with_head(lengths, keys, **kw) == [[0, 1, 2, 3, 4, 5]]
    assert plan_with_head(lengths, keys, express=True, **kw) == [[0, 1], [2, 3, 4, 5]]
    # One request per org (an express batch of fresh orgs): one call.
    assert plan_with_head([10, 10], ["q", "c"], express=True, **kw) == [[0, 1]]


def test_an_express_batch_comes_only_from_the_highest_tier_with_work():
    """Strict tiers: a fresh org of a lower tier does not go ahead of a higher tier's work."""
    config = build_config(orgs={"bulk": "gold", "quiet": "free", "calm": "gold"},
                          endpoints={"embed": {"quantum": 4, "max_batch_tokens": 8,
                                               "max_batch_size": 4,
                                               "max_request_tokens": 4}}).config
    core = Scheduler(config)

    def entry(i, org, tier):
        e = _entry(i, org)
        e.tier = tier
        return e

    for i in range(6):
        core.push("embed", entry(i, "bulk", "gold"))
    assert [e.org for e in core.next_batch("embed", 1.0).batch] == ["bulk"] * 4
    core.push("embed", entry(10, "quiet", "free"))
    assert not core.has_fresh("embed")
    assert core.next_batch("embed", 1.0, fresh=True).batch == []
    core.push("embed", entry(11, "calm", "gold"))
    assert core.has_fresh("embed")
    assert [e.id for e in core.next_batch("embed", 1.0, fresh=True).batch] == ["r11"]


def test_an_express_batch_reports_its_round_trip_but_not_its_speed():
    """Its call's fixed cost over a request or two would read as a slow worker; one
    topped up to half a batch or more is measured as any batch."""
    flow = FlowControl(10_000, mode="credit", full_batch_tokens={"embed": 8})
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0],
                             slots=4, free_slots=4, sent_ms=1000), 1000)

    def done(batch_id: str, tokens: int, service_ms: float, now_ms: int) -> bool:
        """Whether the flow says the batch was an express one (the service rate's input)."""
        return flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="batch_done",
                                        partitions=[0], slots=4, free_slots=4, sent_ms=now_ms,
                                        batch_id=batch_id, batch_tokens=tokens,
                                        service_ms=service_ms, held_ms=service_ms),
                            now_ms).express

    flow.sent("w", "b1", 1000, 800)
    assert done("b1", 800, 8.0, 1020) is False
    credit = flow.workers["w"].credit
    assert credit.ms_per_token == 0.01 and credit.round_trip_ms == 12.0
    flow.sent("w", "e1", 1100, 2, express=True)
    assert done("e1", 2, 2.0, 1116) is True                   # 1 ms a token, if it counted
    assert credit.ms_per_token == 0.01
    assert credit.round_trip_ms != 12.0                       # its round trip did count
    # Topped up to half a full batch (8 tokens) or more, it is a batch like another.
    flow.sent("w", "e2", 1200, 4, express=True)
    assert done("e2", 4, 0.08, 1220) is True                  # 0.02 ms a token
    assert credit.ms_per_token != 0.01


#: The service tests' clock: a worker's hello here, its batches after.
_NOW_MS = 1_000_000


def _service(**endpoint) -> SchedulerService:
    """A scheduler service on one embed lane (``max_batch_tokens`` 1000, and ``endpoint``)."""
    cfg = build_config(prefix="t.", endpoints={"embed": {"max_batch_tokens": 1000,
                                                        "max_request_tokens": 500,
                                                        **endpoint}},
                       orgs={"a": "free"}).config
    return SchedulerService(cfg, KafkaSettings(bootstrap="127.0.0.1:9"),
                            registry=CollectorRegistry())


def _hello(svc: SchedulerService) -> None:
    svc._observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0],
                             slots=2, free_slots=2, sent_ms=_NOW_MS, in_flight=[]), _NOW_MS)


def _report_done(svc: SchedulerService, batch_id: str, *, tokens: int, requests: int,
                 at: int) -> None:
    """Worker ``w`` reports ``batch_id`` done ``at`` ms after the hello, after 100 ms of model."""
    svc.flow.sent("w", batch_id, _NOW_MS + at - 100, tokens)
    svc._observe(WorkerEvent(worker="w", endpoint="embed", kind="batch_done",
                             partitions=[0], slots=2, free_slots=2, sent_ms=_NOW_MS + at,
                             in_flight=[], batch_id=batch_id, batch_tokens=tokens,
                             batch_requests=requests, inference_ms=100, service_ms=100,
                             held_ms=100), _NOW_MS + at)


def test_the_scheduler_measures_its_rate_on_batches_full_by_count():
    """Through the service: a batch_done of 32 short requests (half of max_batch_size,
    a tenth of max_batch_tokens) sets the published rate; 31 of them do not."""
    svc = _service(max_batch_size=64)
    _hello(svc)
    _report_done(svc, "b1", tokens=31 * 3, requests=31, at=1000)
    assert svc.rates.total(["w"]) == 0.0
    _report_done(svc, "b2", tokens=32 * 3, requests=32, at=2000)
    assert svc.rates.total(["w"]) == pytest.approx(96 / 0.1)


def test_the_first_measured_rate_is_published_at_once_not_at_the_next_tick():
    """Until admission has a rate its throttle is off and its pacing guesses: the first batch that
    sets a worker's rate brings the next snapshot forward and wakes the dispatch loop;
    a batch that does not set it (too small), or a later one, leaves the tick alone."""
    svc = _service()
    _hello(svc)
    for batch_id, tokens, at, brought_forward in (("b1", 20, 1000, False),
                                                   ("b2", 800, 2000, True),
                                                   ("b3", 800, 3000, False)):
        svc._next_state_s = 5_000.0
        svc._wake.clear()
        _report_done(svc, batch_id, tokens=tokens, requests=1, at=at)
        assert (svc._next_state_s == 0.0, svc._wake.is_set()) == (brought_forward,) * 2, batch_id


def test_the_scheduler_takes_the_express_calls_share_from_the_rate_it_publishes():
    """Through the service: a batch the flow sent as express is reported as such to
    the service rate, so the throttle's rate leaves its call's time out of the held work's."""
    svc = _service()

    def event(kind: str, sent_ms: int, in_flight: list[str], **kw) -> WorkerEvent:
        return WorkerEvent(worker="w", endpoint="embed", kind=kind, partitions=[0], slots=2,
                           free_slots=1, sent_ms=sent_ms, in_flight=in_flight, **kw)

    now = 1_000_000
    svc._observe(event("hello", now, []), now)
    svc.flow.sent("w", "b1", now, 1000)
    svc.flow.sent("w", "e1", now, 20, express=True)
    svc.flow.sent("w", "b2", now, 1000)
    for batch_id, tokens, ms, at, rest in (("b1", 1000, 400, 400, ["e1", "b2"]),
                                           ("e1", 20, 100, 500, ["b2"]),
                                           ("b2", 1000, 400, 900, [])):
        svc._observe(event("batch_done", now + at, rest, batch_id=batch_id,
                           batch_tokens=tokens, inference_ms=ms, service_ms=ms, held_ms=ms),
                     now + at)
    # Full batches at 2,500 tokens/s; the express call took 0.1 s of the 0.5 s
    # since b1: a share of 0.2, into an EMA (alpha 0.2) that b1 started at 0.
    assert svc.rates.total(["w"]) == pytest.approx(2500 * (1 - 0.2 * 0.2))


def test_the_dispatcher_and_the_simulator_default_to_the_service_settings():
    """The same default in three places (the pure core cannot import the settings):
    the simulator's "as live" holds only while they agree."""
    import msgspec

    from plumbing.service_settings import SchedulerSettings
    from traffic.simulate import SimSettings

    live = {f.name: f.default for f in msgspec.structs.fields(SchedulerSettings)}
    disp = Dispatcher(Scheduler(CONFIG), FlowControl(10_000), Backlog(), instance="s")
    assert (disp.express, disp.express_fill) == (live["express_batches"], live["express_fill"])
    sim = SimSettings()
    assert (sim.express, sim.express_fill) == (live["express_batches"], live["express_fill"])
