"""FlowControl: the worker-slot registry built from worker events (fixed slots; credit in test_credit)."""

from scheduler.flow import Claim, FlowControl
from schemas.messages import WorkerEvent

T = 10_000  # worker timeout (ms)


def ev(worker, kind="heartbeat", parts=(0,), slots=2, sent=0, in_flight=(), batch_id=None,
       endpoint="embed"):
    return WorkerEvent(worker=worker, endpoint=endpoint, kind=kind, partitions=list(parts),
                       slots=slots, free_slots=slots, sent_ms=sent, in_flight=list(in_flight),
                       batch_id=batch_id)


def test_no_worker_no_claim():
    """Nothing is sent while no worker announced itself."""
    assert FlowControl(T, mode="slots").claim("embed") is None


def test_claims_never_exceed_slots_until_done():
    """A worker gets at most `slots` batches until it reports one done."""
    f = FlowControl(T, mode="slots")
    assert f.observe(ev("w1", "hello", parts=(0, 1), slots=2, sent=1000), 1000).joined
    c1 = f.claim("embed")
    f.sent(c1.worker, "b1", 1001)
    c2 = f.claim("embed")
    f.sent(c2.worker, "b2", 1002)
    assert {c1.partition, c2.partition} == {0, 1}  # round-robin over its partitions
    assert f.claim("embed") is None
    # A heartbeat that does not yet list the batches changes nothing.
    f.observe(ev("w1", parts=(0, 1), sent=1003), 1003)
    assert f.claim("embed") is None
    obs = f.observe(ev("w1", "batch_done", parts=(0, 1), sent=1004, batch_id="b1"), 1004)
    assert obs.done_batch == "w1"
    assert f.claim("embed") is not None


def test_prefers_most_free_slots():
    """The worker with the most free slots is chosen first."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", parts=(0,), slots=1, sent=1), 1)
    f.observe(ev("b", "hello", parts=(1,), slots=3, sent=1), 1)
    assert f.claim("embed") == Claim("b", 1)
    f.sent("b", "x", 2)
    f.sent("b", "y", 3)
    assert f.claim("embed") == Claim("a", 0)  # both 1 free: a was sent to less recently


def test_silent_worker_is_lost_with_its_batches():
    """A worker silent past the timeout loses its slots and its batches are forgotten."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("w1", "hello", sent=0), 0)
    f.sent("w1", "b1", 10)
    assert f.expire(T - 1) == []
    lost = f.expire(T + 1)
    assert [(x.worker, x.forgotten, x.reason) for x in lost] == [("w1", ["b1"], "timeout")]
    assert f.claim("embed") is None and f.outstanding("b1") is None


def test_bye_removes_at_once():
    """A worker that says bye is gone immediately."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("w1", "hello", sent=0), 0)
    obs = f.observe(ev("w1", "bye", parts=(), slots=0, sent=5), 5)
    assert obs.lost is not None and obs.lost.reason == "bye"
    assert f.claim("embed") is None


def test_stale_events_are_ignored():
    """Events older than the timeout (a replay after a restart) do not create workers."""
    f = FlowControl(T, mode="slots")
    assert not f.observe(ev("w1", "hello", sent=0), T + 1).accepted
    assert f.claim("embed") is None


def test_batch_done_by_another_worker_frees_the_slot():
    """After a rebalance, whoever reports a batch done frees its slot."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", parts=(0,), slots=1, sent=0), 0)
    f.sent("a", "b1", 1)
    f.observe(ev("b", "batch_done", parts=(0,), slots=1, sent=2, batch_id="b1"), 2)
    f.observe(ev("a", parts=(1,), slots=1, sent=3), 3)
    assert f.claim("embed") in (Claim("a", 1), Claim("b", 0))
    assert f.outstanding("b1") is None


def test_unconfirmed_batch_is_forgotten_after_timeout():
    """A batch its worker never lists in hand stops holding a slot after the timeout."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", slots=1, sent=0), 0)
    f.sent("a", "b1", 1)
    f.observe(ev("a", slots=1, sent=T + 5), T + 5)
    lost = f.expire(T + 5)
    assert [(x.worker, x.forgotten, x.reason) for x in lost] == [("a", ["b1"], "unconfirmed")]
    assert f.claim("embed") == Claim("a", 0)


def test_batch_in_hand_keeps_its_slot():
    """A slow batch the worker lists in hand keeps its slot past the timeout."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", slots=1, sent=0), 0)
    f.sent("a", "b1", 1)
    f.observe(ev("a", slots=1, sent=T + 5, in_flight=("b1",)), T + 5)
    assert f.expire(T + 6) == []
    assert f.claim("embed") is None


def test_in_hand_batches_count_after_scheduler_restart():
    """A fresh registry counts the batches a worker says it holds."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", slots=1, sent=0, in_flight=("old",)), 0)
    assert f.claim("embed") is None


def test_partition_goes_to_newest_announcement():
    """A partition announced by two workers is addressed only through the newer one."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", parts=(0, 1), slots=4, sent=0), 0)
    f.observe(ev("b", "hello", parts=(1,), slots=1, sent=5), 5)
    f.observe(ev("a", parts=(0, 1), slots=4, sent=3), 6)  # late, older heartbeat
    seen = set()
    for i in range(5):
        c = f.claim("embed")
        f.sent(c.worker, f"b{i}", 10 + i)
        seen.add(c)
    assert seen == {Claim("a", 0), Claim("b", 1)}


def test_endpoints_are_separate():
    """A free worker of one endpoint is never used for another."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", endpoint="rerank", sent=0), 0)
    assert f.claim("embed") is None
    assert f.claim("rerank") == Claim("a", 0)


def test_heartbeat_listing_a_done_batch_does_not_count_it_again():
    """An event sent just before a batch's done report, read after it, frees nothing twice."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", slots=1, sent=0), 0)
    f.sent("a", "b1", 1)
    f.observe(ev("a", "batch_done", slots=1, sent=5, batch_id="b1"), 5)
    f.observe(ev("a", slots=1, sent=6, in_flight=("b1",)), 6)
    assert f.claim("embed") == Claim("a", 0)


def test_next_expiry_skips_batches_only_an_event_can_free():
    """A long batch in hand past the timeout does not make the next expiry lie in the past."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("a", "hello", slots=1, sent=0), 0)
    f.sent("a", "b1", 1)
    f.observe(ev("a", slots=1, sent=2 * T, in_flight=("b1",)), 2 * T)
    assert f.expire(2 * T) == []
    assert f.next_expiry_ms() == 3 * T  # the worker's own silence timeout, not b1's


def test_takeover_waits_for_an_event_sent_after_it():
    """A new leader sends to a worker only once it heard from it after the takeover."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("w1", "hello", parts=(0,), slots=2, sent=1000, in_flight=("old-1",)), 1000)
    assert f.claim("embed") is not None
    f.takeover(2000)
    assert f.claim("embed") is None and f.free_slots("embed") == 0
    f.observe(ev("w1", parts=(0,), slots=2, sent=1999), 2001)  # sent before the takeover
    assert f.claim("embed") is None
    # The worker has since fetched the old leader's second batch: it lists both.
    f.observe(ev("w1", parts=(0,), slots=2, sent=2100, in_flight=("old-1", "old-2")), 2100)
    assert f.claim("embed") is None, "both slots hold the old leader's batches"
    f.observe(ev("w1", "batch_done", parts=(0,), slots=2, sent=2200, in_flight=("old-2",),
                 batch_id="old-1"), 2200)
    assert f.claim("embed") == Claim("w1", 0)


def test_forget_unconfirmed_keeps_batches_in_hand():
    """After a broker restart, batches sent but never listed in hand stop holding slots."""
    f = FlowControl(T, mode="slots")
    f.observe(ev("w1", "hello", parts=(0, 1), slots=2, sent=1, in_flight=("held",)), 1)
    f.sent("w1", "lost", 2)
    assert f.claim("embed") is None
    assert f.forget_unconfirmed() == ["lost"]
    assert f.outstanding("held") == "w1" and f.claim("embed") is not None
