"""Credit in time: a worker holds what its measured speed needs to cover the round trip."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.credit import Credit
from scheduler.flow import FlowControl
from schemas.messages import WorkerEvent

T = 10_000  # worker timeout (ms)
FULL = 1000  # tokens of a full batch


def ev(kind="heartbeat", *, sent, slots=8, in_flight=(), released=(), batch_id=None,
       tokens=0, service_ms=0.0, held_ms=0.0, worker="w1"):
    return WorkerEvent(worker=worker, endpoint="embed", kind=kind, partitions=[0, 1],
                       slots=slots, free_slots=slots, sent_ms=sent, in_flight=list(in_flight),
                       released=list(released), batch_id=batch_id, batch_tokens=tokens,
                       service_ms=service_ms, held_ms=held_ms)


def flow(max_outstanding_ms: float = 500.0) -> FlowControl:
    return FlowControl(T, mode="credit", max_outstanding_ms=max_outstanding_ms,
                       full_batch_tokens={"embed": FULL})


def fill(f: FlowControl, now: float, prefix: str) -> list[str]:
    """Send batches to the endpoint until flow control says no; their ids."""
    sent = []
    while (c := f.claim("embed")) is not None:
        bid = f"{prefix}{len(sent)}"
        f.sent(c.worker, bid, now, FULL)
        sent.append(bid)
        assert len(sent) <= 64, "flow control never said no"
    return sent


def measure(f: FlowControl, now: float, *, service_ms: float, round_trip_ms: float,
            rounds: int = 30) -> float:
    """Serve ``rounds`` full batches one at a time at these speeds; returns the clock."""
    for i in range(rounds):
        c = f.claim("embed")
        assert c is not None
        bid = f"m{now}-{i}"
        f.sent(c.worker, bid, now, FULL)
        held = service_ms + 1.0
        now += held + round_trip_ms
        f.observe(ev("batch_done", sent=now, batch_id=bid, tokens=FULL, service_ms=service_ms,
                     held_ms=held), now)
    return now


def test_an_unmeasured_worker_gets_one_batch_at_a_time():
    """Nothing is known of a new worker's speed: one batch, then its report decides."""
    f = flow()
    f.observe(ev("hello", sent=0), 0)
    assert fill(f, 1, "b") == ["b0"]


def test_a_fast_worker_gets_enough_to_cover_the_round_trip():
    """16 ms batches, 30 ms round trip: a round trip of work behind the one it runs."""
    f = flow()
    f.observe(ev("hello", sent=0), 0)
    now = measure(f, 1, service_ms=16, round_trip_ms=30)
    held = fill(f, now, "b")
    # Room while work < round trip = 30 ms: 0, 16 -> 2 batches (32 ms).
    assert len(held) == 2


def test_a_slow_worker_under_the_ceiling_gets_one_batch_more_only_when_one_is_released():
    """300 ms batches, a 300 ms ceiling: one at a time; the release frees the next."""
    f = flow(max_outstanding_ms=300)
    f.observe(ev("hello", sent=0), 0)
    now = measure(f, 1, service_ms=300, round_trip_ms=30)
    assert fill(f, now, "b") == ["b0"]
    # The worker starts b0's last micro-batch: its credit comes back.
    f.observe(ev(sent=now + 250, in_flight=["b0"], released=["b0"]), now + 250)
    assert fill(f, now + 250, "c") == ["c0"]


def test_at_the_slot_cap_a_released_batch_frees_its_slot():
    """A fast worker fills its 2 slots; the credit a batch returns makes room for one more
    (the cap counts unreleased batches), and only one."""
    f = flow(max_outstanding_ms=10_000)
    f.observe(ev("hello", sent=0, slots=2), 0)
    now = measure(f, 1, service_ms=1, round_trip_ms=500)
    f.observe(ev(sent=now, slots=2), now)  # its reports said 8: 2 from now on
    assert fill(f, now, "b") == ["b0", "b1"]
    f.observe(ev(sent=now + 1, slots=2, in_flight=["b0", "b1"], released=["b0"]), now + 1)
    assert fill(f, now + 1, "c") == ["c0"]


def test_credit_follows_a_changing_round_trip():
    """A longer round trip gives the worker more work to cover it, a shorter one less."""
    f = flow(max_outstanding_ms=10_000)
    f.observe(ev("hello", sent=0), 0)
    now = measure(f, 1, service_ms=10, round_trip_ms=15)
    short = len(fill(f, now, "a"))
    for b in [f"a{i}" for i in range(short)]:
        f.done(b)
    now = measure(f, now, service_ms=10, round_trip_ms=100)
    long = len(fill(f, now, "b"))
    for b in [f"b{i}" for i in range(long)]:
        f.done(b)
    now = measure(f, now, service_ms=10, round_trip_ms=15)
    again = len(fill(f, now, "c"))
    # work < round trip: 2 at 15 ms, 10 at 100 ms (capped at the 8 slots).
    assert short == 2 and long == 8 and again == 2


def test_a_round_trip_that_varies_is_covered_beyond_its_average():
    """Same average round trip, one steady and one jittery: the jittery one gets more work.

    The next batch comes back in this round trip, not the average one: a
    worker covered for the average runs dry on every longer one.
    """
    def held(trips: list[float]) -> int:
        f = flow()
        f.observe(ev("hello", sent=0), 0)
        now = 1.0
        for rt in trips:
            now = measure(f, now, service_ms=16, round_trip_ms=rt, rounds=1)
        return len(fill(f, now, "b"))

    steady = [20.0] * 40
    jittery = [5.0, 35.0] * 20  # average 20, mean deviation 15
    # Steady: work < 20 -> 0, 16: 2 batches. Jittery: cover ~ 20 + 2 x 15 = 50
    # -> 0, 16, 32, 48: 4 batches.
    assert held(steady) == 2
    assert held(jittery) == 4


def test_the_deviation_fades_when_the_round_trip_settles():
    """A jittery spell, then a steady one: the extra cover goes away again."""
    c = Credit()
    for rt in [5.0, 35.0] * 20:
        c.observe(tokens=FULL, service_ms=10, round_trip_ms=rt)
    jittery = c.cover_ms()
    for _ in range(60):
        c.observe(tokens=FULL, service_ms=10, round_trip_ms=20.0)
    assert jittery > 40
    assert 20.0 <= c.cover_ms() < 20.5


def test_max_outstanding_ms_caps_what_a_long_round_trip_would_ask_for():
    """A round trip of seconds must not queue seconds of work ahead of everyone."""
    f = flow(max_outstanding_ms=100)
    f.observe(ev("hello", sent=0), 0)
    now = measure(f, 1, service_ms=20, round_trip_ms=2_000)
    assert len(fill(f, now, "b")) == 5  # work < 100: 0, 20, 40, 60, 80


def test_a_silent_workers_credit_expires():
    """A worker silent past the timeout gets nothing more; its batches are forgotten."""
    f = flow()
    f.observe(ev("hello", sent=0), 0)
    now = measure(f, 1, service_ms=5, round_trip_ms=5)
    assert fill(f, now, "b")
    lost = f.expire(now + T + 1)
    assert [x.reason for x in lost] == ["timeout"]
    assert f.claim("embed") is None


def test_slots_mode_counts_released_batches_until_done():
    """The fixed mode: every outstanding batch holds its slot until reported done."""
    f = FlowControl(T, mode="slots", full_batch_tokens={"embed": FULL})
    f.observe(ev("hello", sent=0, slots=2), 0)
    assert fill(f, 1, "b") == ["b0", "b1"]
    f.observe(ev(sent=2, slots=2, in_flight=["b0", "b1"], released=["b0"]), 2)
    assert f.claim("embed") is None


def test_credit_rule_alone():
    """Credit.room: the cap, the empty worker, the estimate, the ceiling."""
    c = Credit()
    assert c.room([], cap=1, max_outstanding_ms=1)
    assert not c.room([FULL], cap=1, max_outstanding_ms=1e9)
    c.observe(tokens=FULL, service_ms=10, round_trip_ms=25)
    # 10 ms a batch, 25 ms round trip: room while work < 25.
    assert c.room([FULL] * 2, cap=4, max_outstanding_ms=1e9)
    assert not c.room([FULL] * 3, cap=8, max_outstanding_ms=1e9)
    assert not c.room([FULL] * 2, cap=2, max_outstanding_ms=1e9)
    assert not c.room([FULL, FULL], cap=4, max_outstanding_ms=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["claim", "done", "release", "report", "tick"]),
    st.integers(0, 30), st.floats(0, 400), st.floats(0, 400)), max_size=80),
    st.integers(1, 6))
def test_never_more_unreleased_outstanding_than_the_cap(ops, cap):
    """Whatever the reports say and in whatever order, unreleased batches <= slots."""
    f = flow(max_outstanding_ms=10_000)
    now = 0.0
    f.observe(ev("hello", sent=0, slots=cap), 0)
    sent: list[str] = []
    for op, pick, a, b in ops:
        now += 1
        if op == "claim":
            c = f.claim("embed")
            if c is not None:
                bid = f"b{len(sent)}"
                f.sent(c.worker, bid, now, FULL)
                sent.append(bid)
        elif op == "done" and sent:
            bid = sent[pick % len(sent)]
            f.observe(ev("batch_done", sent=now, slots=cap, batch_id=bid, tokens=FULL,
                         service_ms=a, held_ms=b), now)
        elif op in ("release", "report") and sent:
            w = f.workers.get("w1")
            hand = list(w.outstanding) if w else []
            rel = hand[: pick % (len(hand) + 1)] if op == "release" else []
            f.observe(ev(sent=now, slots=cap, in_flight=hand, released=rel), now)
        elif op == "tick":
            now += a
            f.expire(now)
        w = f.workers.get("w1")
        if w is not None:
            assert len(w.unreleased()) <= cap
