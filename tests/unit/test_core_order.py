"""Request order: inside an org by (priority desc, deadline asc, arrival asc); FIFO baseline by arrival."""

from __future__ import annotations

from scheduler import Entry, Scheduler
from tests.core_setup import ENDPOINT, config_for, flat, ids, run_until_empty


def _served(s: Scheduler) -> list[str]:
    return ids(flat(run_until_empty(s, 0.0)))


def test_higher_priority_first_within_an_org():
    """An org's requests leave by priority, highest first, whatever the push order."""
    s = Scheduler(config_for())
    for rid, p in [("p0", 0), ("p2", 2), ("p1", 1), ("p9", 9)]:
        s.push(ENDPOINT, Entry(rid, "a", "t0", 10, priority=p))
    assert _served(s) == ["p9", "p2", "p1", "p0"]


def test_earlier_deadline_first_at_equal_priority_and_no_deadline_last():
    """At equal priority the earlier deadline leaves first; a request without deadline after all."""
    s = Scheduler(config_for())
    for rid, dl in [("none", None), ("d30", 30.0), ("d10", 10.0), ("d20", 20.0)]:
        s.push(ENDPOINT, Entry(rid, "a", "t0", 10, deadline=dl))
    assert _served(s) == ["d10", "d20", "d30", "none"]


def test_priority_outranks_deadline():
    """A higher priority without deadline leaves before a lower priority with an early deadline."""
    s = Scheduler(config_for())
    s.push(ENDPOINT, Entry("urgent-low", "a", "t0", 10, priority=0, deadline=1.0))
    s.push(ENDPOINT, Entry("lax-high", "a", "t0", 10, priority=1))
    assert _served(s) == ["lax-high", "urgent-low"]


def test_earlier_arrival_first_even_if_pushed_later():
    """At equal priority and deadline, the earlier ``arrival`` leaves first, not the earlier push."""
    s = Scheduler(config_for())
    for rid, arrival in [("t5", 5.0), ("t1", 1.0), ("t3", 3.0)]:
        s.push(ENDPOINT, Entry(rid, "a", "t0", 10, arrival=arrival))
    assert _served(s) == ["t1", "t3", "t5"]


def test_push_order_breaks_a_full_tie():
    """Requests equal in priority, deadline and arrival leave in push order."""
    s = Scheduler(config_for())
    for rid in ["x", "b", "m", "a"]:
        s.push(ENDPOINT, Entry(rid, "a", "t0", 10, arrival=1.0, deadline=9.0))
    assert _served(s) == ["x", "b", "m", "a"]


def test_priority_orders_inside_an_org_not_across_orgs():
    """A high-priority org does not jump the DRR turn of another org: priority is per org."""
    s = Scheduler(config_for(cost_model="requests", quantum=1))
    for i in range(3):
        s.push(ENDPOINT, Entry(f"low{i}", "a", "t0", 10, priority=0))
    for i in range(3):
        s.push(ENDPOINT, Entry(f"high{i}", "b", "t0", 10, priority=9))
    assert _served(s) == ["low0", "high0", "low1", "high1", "low2", "high2"]


def test_fifo_baseline_serves_by_arrival_across_orgs_tiers_and_priorities():
    """policy=fifo: one queue by arrival (then push order), ignoring tier, org, priority and deadline."""
    cfg = config_for(tiers=("gold", "free"), orgs={"g": "gold", "f": "free"}, max_batch_size=2)
    s = Scheduler(cfg, policy="fifo")
    pushes = [("f-t1", "f", "free", 1.0, 0), ("g-t2", "g", "gold", 2.0, 9),
              ("f-t0", "f", "free", 0.0, 0), ("g-t1", "g", "gold", 1.0, 0)]
    for rid, org, tier, arrival, prio in pushes:
        s.push(ENDPOINT, Entry(rid, org, tier, 10, arrival=arrival, priority=prio, deadline=50.0))
    batches = run_until_empty(s, 0.0)
    assert [ids(b) for b in batches] == [["f-t0", "f-t1"], ["g-t1", "g-t2"]]
