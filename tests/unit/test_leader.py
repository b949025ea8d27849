"""Leader election pieces that need no broker: the epoch and the sticky assignment."""

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from plumbing.kafka import KafkaSettings
from scheduler.leader import LeaderElection, _KeepLeaderAssignor, choose_leader, next_epoch


class _Cluster:
    def __init__(self, partitions):
        self.partitions = partitions

    def partitions_for_topic(self, topic):
        return self.partitions.get(topic)


def _election(instance="a"):
    async def noop(*_):
        return None
    return LeaderElection(KafkaSettings(bootstrap="x:1"), "p.scheduler-leader",
                          "p.scheduler-leader", instance, None, on_elected=noop,
                          on_deposed=noop, on_suspend=lambda: None, on_resume=lambda: None)


def test_epoch_grows_past_claims_and_clock():
    """A new epoch is above every claim and our last, and at least the clock."""
    assert next_epoch(1_000, 0) == 1_000
    assert next_epoch(1_000, 5_000) == 5_001  # a leader whose clock ran ahead
    assert next_epoch(1_000, 0, own_last=2_000) == 2_001


def test_current_leader_keeps_partition_zero():
    """The member claiming the highest epoch wins; with no claim, the smallest member id."""
    assert choose_leader({"m-b": 0, "m-a": 0}) == "m-a"
    assert choose_leader({"m-a": 0, "m-z": 7}) == "m-z"
    assert choose_leader({"m-a": 3, "m-z": 7}) == "m-z"
    assert choose_leader({}) is None


def test_assignor_metadata_carries_the_claim_and_assigns_one_member():
    """Join metadata carries the epoch led with; only the chosen member gets partitions."""
    leader, standby = _election("a"), _election("b")
    leader.state, leader.epoch = "suspended", 42
    md_leader = leader._assignor.metadata(["p.scheduler-leader"])
    md_standby = standby._assignor.metadata(["p.scheduler-leader"])
    assert md_standby.user_data == b""
    members = {"m-0": md_standby, "m-9": md_leader}
    out = leader._assignor.assign(_Cluster({"p.scheduler-leader": {0}}), members)
    assert out["m-9"].assignment == [("p.scheduler-leader", [0])]
    assert out["m-0"].assignment == []
    # Metadata from another version of the assignor (no claim) counts as none.
    odd = ConsumerProtocolMemberMetadata(0, ["p.scheduler-leader"], b"\x01")
    out = _KeepLeaderAssignor.assign(_Cluster({"p.scheduler-leader": {0}}),
                                     {"m-1": odd, "m-2": md_standby})
    assert out["m-1"].assignment == [("p.scheduler-leader", [0])]


def test_lease_lapses_without_confirmation():
    """Without an accepted heartbeat within two thirds of the session, the lease is off."""
    e = _election()
    e.state = "leading"
    assert not e.lease_valid()
    e._confirm()
    assert e.lease_valid()
    e._confirmed -= e.lease_s + 0.01
    assert not e.lease_valid()
