"""Admission's backlog, the pure parts: which records go there, their wire form, and
where a record read back joins the read-ahead (:mod:`producer.backlog`)."""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import pytest

from producer.backlog import BACKLOG_HEADER, KEEP, SPILL, Backlog, decode, encode, item_bytes
from producer.readahead import ReadAhead
from schemas.packs import split


class Rec(NamedTuple):
    key: bytes | None
    value: bytes
    headers: tuple = ()
    timestamp: int = 0
    offset: int = 0


def test_an_org_goes_to_the_backlog_at_its_bound_and_stays_there_until_read_back():
    b = Backlog(after=3)
    # Under the bound: read ahead.
    assert [b.route(0, b"bulk", held, held) for held in (0, 1, 2)] == [KEEP] * 3
    # At it: this one to the backlog (its 3 read ahead stay, ahead of it); counted out.
    assert b.route(0, b"bulk", 3, 3) == SPILL
    assert b.out(0, b"bulk") == 1
    # Once some are out, every later one goes there too, however few are read ahead:
    # a record kept back would be decided before the older ones in the backlog.
    assert b.route(0, b"bulk", 0, 0) == SPILL
    assert b.out(0, b"bulk") == 2
    assert b.spilled() == [(0, b"bulk")]
    # Another org of the partition, and the same org on another partition, are their own.
    assert b.route(0, b"quiet", 0, 3) == KEEP
    assert b.route(1, b"bulk", 0, 3) == KEEP
    b.read_back(0, b"bulk")
    assert b.route(0, b"bulk", 0, 0) == SPILL  # one still out (and now this one): behind it
    b.read_back(0, b"bulk")
    b.read_back(0, b"bulk")
    assert b.out(0, b"bulk") == 0
    assert b.route(0, b"bulk", 2, 2) == KEEP  # all back: read ahead again
    assert len(b) == 0 and b.spilled() == []


def test_nothing_goes_to_the_backlog_until_the_read_ahead_holds_from_records():
    """A burst the read-ahead holds below ``from_records`` is kept there, however far past
    ``after`` its org is; from then on its later records go, and stay going."""
    b = Backlog(after=3, from_records=10)
    assert [b.route(0, b"bulk", held, held) for held in range(10)] == [KEEP] * 10
    assert b.out(0, b"bulk") == 0
    # Pressed, but this org under its own bound: kept.
    assert b.route(0, b"quiet", 2, 10) == KEEP
    # Pressed, and the org at its bound: from here to the backlog.
    assert b.route(0, b"bulk", 10, 10) == SPILL
    # The read-ahead below the mark again: the org still goes there while it has some out.
    assert b.route(0, b"bulk", 5, 5) == SPILL
    assert b.out(0, b"bulk") == 2


def test_records_a_former_owner_wrote_do_not_count_below_zero():
    b = Backlog(after=1)
    b.read_back(0, b"bulk")  # written before this instance's assignment
    assert b.out(0, b"bulk") == 0
    assert b.route(0, b"bulk", 0, 0) == KEEP


def test_zero_never_spills():
    b = Backlog(after=0)
    assert b.route(0, b"bulk", 10**9, 10**9) == KEEP


def test_a_backlog_record_keeps_every_field_of_its_ingress_records_in_order():
    recs = [Rec(b"bulk", b'{"id":"a"}', (("content-type", b"application/json"),), 17),
            Rec(None, b"\x00\xff", (), 18),
            Rec(b"quiet", b"", (("x", b""), ("y", b"1")), 19)]
    back = decode("sf.backlog", 3, 42, encode(recs), [BACKLOG_HEADER])
    assert [(r.key, r.value, r.headers, r.timestamp) for r in back] == [
        (r.key, r.value, r.headers, r.timestamp) for r in recs]
    # Where it came from: the backlog record, shared by its records.
    assert {(r.topic, r.partition, r.offset) for r in back} == {("sf.backlog", 3, 42)}


@pytest.mark.parametrize(("value", "headers", "why"), [
    (None, [BACKLOG_HEADER], "undecodable"),
    (b"\xc1", [BACKLOG_HEADER], "undecodable"),
    (msgspec.msgpack.encode([[b"k", 1, [], 0]]), [BACKLOG_HEADER], "undecodable"),
    (encode([Rec(b"k", b"v")]), [], "version 1"),
    (encode([Rec(b"k", b"v")]), [("sf-backlog", b"2")], "version 1"),
])
def test_what_is_not_a_backlog_record_says_why(value, headers, why):
    with pytest.raises(ValueError, match=why):
        decode("sf.backlog", 0, 0, value, headers)


def test_an_empty_backlog_record_holds_nothing():
    assert decode("t", 0, 0, encode([]), [BACKLOG_HEADER]) == []


def test_records_are_cut_by_count_as_well_as_bytes():
    sizes = [item_bytes(Rec(b"k", b"x" * 10)) for _ in range(250)]
    parts = split(sizes, 10**9, 100)
    assert [len(p) for p in parts] == [100, 100, 50]
    assert [i for p in parts for i in p] == list(range(250))
    # Bytes still cut, below the count.
    assert max(len(p) for p in split(sizes, 10 * sizes[0], 100)) < 10


def test_a_record_read_back_joins_its_org_behind_what_it_has_read_ahead():
    """A burst's first records read ahead from ingress partition 0, its later ones back
    from the backlog: one group, in order, and each named with its own partition (where
    its offset is released)."""
    ahead = ReadAhead()
    ahead.add("in-0", [Rec(b"bulk", b"1"), Rec(b"bulk", b"2")])
    ahead.add("in-0", [Rec(b"quiet", b"q")])
    ahead.add("back-0", [Rec(b"bulk", b"3"), Rec(b"bulk", b"4")], group="in-0")
    assert ahead.count("in-0", b"bulk") == 4
    assert ahead.count("back-0", b"bulk") == 0
    taken = ahead.take(10)
    bulk = [(tp, r.value) for tp, r, _ in taken if r.key == b"bulk"]
    assert bulk == [("in-0", b"1"), ("in-0", b"2"), ("back-0", b"3"), ("back-0", b"4")]
    # The quiet org is still taken in the first turn, not behind the burst.
    assert taken[1][1].key == b"quiet"
    assert len(ahead) == 0
