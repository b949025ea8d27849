"""The order admission decides in: one (partition, org) group at a time in turn."""

from collections import namedtuple

from hypothesis import given
from hypothesis import strategies as st

from producer.readahead import ReadAhead

Rec = namedtuple("Rec", "key value")


def _records(org: str, n: int, start: int = 0) -> list[Rec]:
    return [Rec(org.encode(), f"{org}-{i}") for i in range(start, start + n)]


def test_a_quiet_org_behind_a_burst_on_its_own_partition_is_decided_in_the_first_step():
    """An org sharing the burst's partition, fetched after 5,000 burst records, goes second."""
    ahead = ReadAhead()
    ahead.add(0, [*_records("bulk", 5000), *_records("quiet", 1)])
    step = [rec.value for _, rec, _ in ahead.take(500)]
    assert step[:2] == ["bulk-0", "quiet-0"]
    assert step[2:] == [f"bulk-{i}" for i in range(1, 499)]
    assert len(ahead) == 5001 - 500


def test_a_quiet_partition_is_decided_in_the_first_step_too():
    """Another partition's record is not behind a burst's fetch."""
    ahead = ReadAhead()
    ahead.add(0, _records("bulk", 3000))
    ahead.add(7, _records("quiet", 2))
    step = [rec.value for _, rec, _ in ahead.take(10)]
    assert step[:4] == ["bulk-0", "quiet-0", "bulk-1", "quiet-1"]


def test_drop_forgets_held_records_of_the_named_partitions():
    """Revoked partitions' records leave the read-ahead; the others stay, in order."""
    ahead = ReadAhead()
    ahead.add(0, _records("a", 3))
    ahead.add(1, _records("b", 2))
    assert ahead.drop([0]) == 3
    assert [rec.value for _, rec, _ in ahead.take(10)] == ["b-0", "b-1"]
    assert len(ahead) == 0


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("abcd"), st.integers(0, 30)),
                max_size=12), st.integers(1, 50))
def test_every_record_once_and_each_org_of_a_partition_in_order(adds, step):
    """Whatever is added in whatever pieces, each record leaves once, each group in order."""
    ahead = ReadAhead()
    added: list[tuple[int, Rec]] = []
    counters: dict[tuple[int, str], int] = {}
    out: list[tuple[int, Rec]] = []
    take = lambda k: [(p, r) for p, r, _ in ahead.take(k)]
    for partition, org, n in adds:
        start = counters.get((partition, org), 0)
        recs = [Rec(org.encode(), (partition, org, i)) for i in range(start, start + n)]
        counters[(partition, org)] = start + n
        ahead.add(partition, recs)
        added += [(partition, r) for r in recs]
        out += take(step)
    while len(ahead):
        got = take(step)
        assert 0 < len(got) <= step
        out += got
    assert sorted(r.value for _, r in out) == sorted(r.value for _, r in added)
    for group in counters:
        mine = [r.value[2] for p, r in out if (p, r.value[1]) == group]
        assert mine == sorted(mine)


def test_a_step_stops_at_its_byte_budget_but_takes_at_least_one_record():
    """Long texts: a step holds what fits in its bytes, and never nothing."""
    ahead = ReadAhead()
    ahead.add(0, [Rec(b"bulk", "x" * 1000) for _ in range(50)])
    assert len(ahead.take(500, max_bytes=10_000)) == 10
    assert len(ahead.take(500, max_bytes=1)) == 1
