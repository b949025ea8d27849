"""The order admission decides a fetch in: partitions in turn, each in its own order."""

from aiokafka.structs import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from producer.service import _interleave


def _tp(p: int) -> TopicPartition:
    return TopicPartition("ingress", p)


def test_a_quiet_partitions_record_is_decided_before_most_of_a_burst():
    batches = {_tp(0): [f"bulk-{i}" for i in range(250)], _tp(7): ["quiet-0"]}
    out = _interleave(batches)
    assert out[:2] == ["bulk-0", "quiet-0"]
    assert out[2:] == [f"bulk-{i}" for i in range(1, 250)]


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=8))
def test_every_record_once_and_each_partition_in_order(sizes):
    batches = {_tp(p): [(p, i) for i in range(n)] for p, n in enumerate(sizes)}
    out = _interleave(batches)
    assert sorted(out) == sorted(r for rs in batches.values() for r in rs)
    for tp, records in batches.items():
        assert [r for r in out if r[0] == tp.partition] == records
    # Round k of every partition comes before round k + 1 of any.
    assert [i for _, i in out] == sorted(i for _, i in out)
