"""A fetch that jumps past offsets not yet readable is held back, then let through once real."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from plumbing.contiguity import Contiguity, Gap


@dataclass(frozen=True)
class Rec:
    offset: int


def recs(*offsets: int) -> list[Rec]:
    return [Rec(o) for o in offsets]


def offsets(records) -> list[int]:
    return [r.offset for r in records]


def test_contiguous_records_pass_whole():
    cut = Contiguity().cut("p0", 10, recs(10, 11, 12), now=0.0)
    assert offsets(cut.kept) == [10, 11, 12]
    assert cut.refetch_from is None and cut.skipped == ()


def test_a_fetch_starting_past_the_position_is_held_and_refetched_from_it():
    cut = Contiguity().cut("p0", 10, recs(13, 14), now=0.0)
    assert offsets(cut.kept) == []
    assert cut.refetch_from == 10


def test_a_jump_inside_a_fetch_keeps_what_came_before_it():
    cut = Contiguity().cut("p0", 10, recs(10, 11, 15, 16), now=0.0)
    assert offsets(cut.kept) == [10, 11]
    assert cut.refetch_from == 12


def test_the_refetched_records_fill_the_jump_and_nothing_is_skipped():
    c = Contiguity(grace_s=0.5)
    assert c.cut("p0", 10, recs(13, 14), now=0.0).refetch_from == 10
    cut = c.cut("p0", 10, recs(10, 11, 12, 13, 14), now=0.01)
    assert offsets(cut.kept) == [10, 11, 12, 13, 14]
    assert cut.skipped == ()
    # A later jump at another offset starts its own grace.
    assert c.cut("p0", 15, recs(20), now=5.0).refetch_from == 15


def test_a_jump_that_outlives_the_grace_goes_through_once_and_is_named():
    c = Contiguity(grace_s=0.5)
    assert c.cut("p0", 10, recs(13), now=1.0).refetch_from == 10
    assert c.cut("p0", 10, recs(13), now=1.4).refetch_from == 10
    cut = c.cut("p0", 10, recs(13, 14), now=1.6)
    assert offsets(cut.kept) == [13, 14]
    assert cut.refetch_from is None
    assert cut.skipped == (Gap(10, 13, pytest.approx(0.6)),)
    # Passed over once: the same span is not remembered any more.
    assert c.cut("p0", 15, recs(15), now=1.7).skipped == ()


def test_partitions_are_held_apart():
    c = Contiguity(grace_s=0.5)
    assert c.cut("p0", 10, recs(13), now=0.0).refetch_from == 10
    # Another partition's old jump does not age this one's.
    assert c.cut("p1", 0, recs(4), now=0.6).refetch_from == 0
    assert c.cut("p0", 10, recs(13), now=0.6).skipped != ()


def test_an_unknown_position_checks_only_inside_the_fetch():
    cut = Contiguity().cut("p0", None, recs(40, 41, 43), now=0.0)
    assert offsets(cut.kept) == [40, 41]
    assert cut.refetch_from == 42


def test_records_before_the_position_are_not_a_jump():
    # A seek back (a restarted broker's topic read again from 0) is not a gap.
    cut = Contiguity().cut("p0", 100, recs(0, 1, 2), now=0.0)
    assert offsets(cut.kept) == [0, 1, 2]


def test_a_negative_grace_is_refused():
    with pytest.raises(ValueError, match="grace_s"):
        Contiguity(grace_s=-1)
