"""Leadership read from the leader partition, without a broker: claims, beats, silence, lease."""

from __future__ import annotations

import pytest

from scheduler.leadership import LeaderLog, Lease, next_epoch
from schemas.messages import LeaderClaim


def beat(instance: str, epoch: int, *, after: int = 0, floor_ms: int | None = None) -> LeaderClaim:
    return LeaderClaim(instance=instance, epoch=epoch, kind="beat", after=after, sent_ms=1,
                       floor_ms=floor_ms)


def claim(instance: str, epoch: int, after: int) -> LeaderClaim:
    return LeaderClaim(instance=instance, epoch=epoch, kind="claim", after=after, sent_ms=1)


def test_next_epoch_is_above_every_claim_and_at_least_the_clock():
    """The new epoch beats the clock, every claim seen and our own last one."""
    assert next_epoch(1000, 5) == 1000
    assert next_epoch(1000, 2000) == 2001
    assert next_epoch(1000, 5, own_last=1500) == 1501


def test_the_first_claim_for_a_succession_wins_in_log_order():
    """Two standbys claim after the same epoch: the first in the log leads, whatever its epoch."""
    log = LeaderLog(1.0)
    log.start(0.0)
    assert log.apply(beat("a", 10), 0.1) == "beat"
    assert log.apply(claim("b", 20, after=10), 2.0) == "claim_won"
    assert log.apply(claim("c", 30, after=10), 2.0) == "claim_lost"
    assert log.leads("b", 20) and not log.leads("c", 30)
    assert log.predecessor(20).instance == "a"
    assert log.chain(20) == [10]


def test_a_deposed_leaders_late_beat_changes_nothing():
    """A beat of an older epoch (a paused leader waking up) is stale; the successor leads."""
    log = LeaderLog(1.0)
    log.start(0.0)
    log.apply(beat("a", 10), 0.0)
    log.apply(claim("b", 20, after=10), 1.5)
    assert log.apply(beat("a", 10), 1.6) == "beat_stale"
    assert log.leads("b", 20)


def test_a_reader_that_missed_the_claim_adopts_the_higher_beat():
    """Reading from the middle of the log: a beat of a higher epoch than the one in force wins."""
    log = LeaderLog(1.0)
    log.start(0.0)
    log.apply(beat("a", 10), 0.0)
    assert log.apply(beat("b", 20, after=10), 0.2) == "beat"
    assert log.leads("b", 20)
    # A claim that does not name the epoch in force loses.
    assert log.apply(claim("c", 30, after=10), 0.3) == "claim_lost"


def test_silence_counts_from_the_last_record_read():
    """A standby may claim only once the leader was silent for the whole silence."""
    log = LeaderLog(1.0)
    log.start(0.0)
    assert not log.silent(0.9)
    assert log.silent(1.0)  # nobody known: silence since the start
    log.apply(beat("a", 10), 1.2)
    assert not log.silent(2.1)
    assert log.silent(2.2)
    log.apply(beat("a", 10, floor_ms=77), 2.3)
    assert not log.silent(2.4)
    assert log.current.floor_ms == 77


def test_a_resignation_lets_a_standby_claim_at_once():
    """The leader's resign makes it silent now; a resign by anyone else does not."""
    log = LeaderLog(1.0)
    log.start(0.0)
    log.apply(beat("a", 10), 0.0)
    assert log.apply(LeaderClaim(instance="x", epoch=5, kind="resign", sent_ms=1), 0.1) == "ignored"
    assert not log.silent(0.2)
    assert log.apply(LeaderClaim(instance="a", epoch=10, kind="resign", sent_ms=1),
                     0.2) == "resigned"
    assert log.silent(0.21)
    c = log.claim("b", now_ms=5, own_last=0)
    assert (c.after, c.epoch, c.kind) == (10, 11, "claim")


def test_a_claim_names_the_highest_epoch_when_no_leader_is_known():
    """A fresh reader claims after the highest epoch it read, above it."""
    log = LeaderLog(1.0)
    log.start(0.0)
    c = log.claim("a", now_ms=100)
    assert (c.after, c.epoch) == (0, 100)
    assert log.apply(c, 0.1) == "claim_won"


def test_silence_must_be_positive():
    """A zero silence is refused with its value."""
    with pytest.raises(ValueError, match="silence_s must be positive"):
        LeaderLog(0)


def test_the_lease_ends_half_a_silence_after_the_confirmed_send():
    """The lease counts from when the confirmed beat was sent, not when it was read back."""
    lease = Lease(0.5)
    assert not lease.valid(0.0)
    lease.confirmed(10.0)
    assert lease.valid(10.49) and not lease.valid(10.5)
    lease.confirmed(9.0)  # an older beat read back late extends nothing
    assert lease.valid(10.49)
    lease.end()
    assert not lease.valid(10.1)
