"""Fuzzing packs: several admitted requests in one tier record (``schemas/packs.py``).

Properties:

* the pack decoder raises nothing but :class:`DecodeError`, and only when the
  pack as a whole cannot be read; otherwise it returns exactly one item per
  item sent, each the request that was packed or an error;
* the scheduler's intake, given a pack of good and hostile items, holds every
  good one, dead-letters each bad one alone (its own bytes as the payload),
  and keeps the record's offset uncommitted until the last request held from
  it is released: nothing lost from a pack with one bad request.
"""

from __future__ import annotations

import random

import msgspec
from hypothesis import event, given
from hypothesis import strategies as st

from scheduler import intake as intake_module
from schemas.codec import DecodeError, codec_for
from schemas.messages import AdmittedRequest, DeadLetter
from schemas.packs import PACK_HEADER, encode_packed, unpack_requests
from tests.fuzz.hostile import fuzz_settings
from tests.fuzz.internal import KINDS, admitted_from, hostile_record_from
from tests.fuzz.test_internal_decoders_fuzz import (
    _LOOP,
    CONFIG,
    TOPICS,
    _quiet,
    _scheduler,
    _tier_record,
)

_SEEDS = st.integers(0, 2**64 - 1)
_codec = codec_for(AdmittedRequest)
_PACK_HEADERS = [("content-type", b"application/msgpack"), PACK_HEADER]
_TP = (TOPICS.tier("free"), 0)


def _good(rng: random.Random, i: int) -> AdmittedRequest:
    """A request the intake holds: a known endpoint, modest tokens, no deadline, a unique id."""
    req = admitted_from(rng)
    return msgspec.structs.replace(req, id=f"p{i}-{rng.getrandbits(32)}",
                                   endpoint=rng.choice(["embed", "rerank"]),
                                   tokens=rng.randint(1, 20), deadline_at_ms=None)


def _bad(rng: random.Random, seed: int) -> bytes:
    """An item no decoder accepts as an AdmittedRequest, in a pack that still parses.

    Bytes that are not one msgpack value (or nest too deep once packed) break
    the pack itself: another property covers those (the whole record is one
    dead letter). Such bytes are wrapped as a msgpack string: a bad item.
    """
    while True:
        value, _, _ = hostile_record_from(AdmittedRequest, rng.choice(KINDS), seed)
        seed += 1
        if not value:
            continue
        try:
            msgspec.msgpack.decode(encode_packed([value]))
        except (msgspec.DecodeError, ValueError, RecursionError):
            return msgspec.msgpack.encode(value.decode("latin-1"))
        try:
            _codec.decode(value)
        except DecodeError:
            return value


def _pack_of(seed: int, n: int, bad_at: set[int]) -> tuple[bytes, list[AdmittedRequest | None],
                                                          list[bytes]]:
    rng = random.Random(seed)
    reqs: list[AdmittedRequest | None] = []
    values: list[bytes] = []
    for i in range(n):
        if i in bad_at:
            reqs.append(None)
            values.append(_bad(rng, seed + i))
        else:
            req = _good(rng, i)
            reqs.append(req)
            values.append(_codec.encode(req))
    return encode_packed(values), reqs, values


_PACKS = st.tuples(_SEEDS, st.integers(1, 6)).flatmap(
    lambda sn: st.tuples(st.just(sn[0]), st.just(sn[1]),
                         st.sets(st.integers(0, sn[1] - 1), max_size=sn[1])))


@fuzz_settings(2_000)
@given(case=_PACKS)
def test_every_item_of_a_pack_comes_back_as_itself_or_an_error(case):
    seed, n, bad_at = case
    data, reqs, values = _pack_of(seed, n, bad_at)
    items = unpack_requests(data)
    assert len(items) == n
    for item, req, value in zip(items, reqs, values, strict=True):
        if req is None:
            assert item.value is None and item.error is not None
            assert item.raw == value  # its own bytes, for its dead letter
        else:
            assert item.error is None and item.value == req
    event(f"{len(bad_at)} bad of {n}")


@fuzz_settings(2_000)
@given(value=st.binary(max_size=200), seed=_SEEDS)
def test_a_hostile_pack_value_raises_only_decode_error(value, seed):
    rng = random.Random(seed)
    # Raw bytes, or a valid pack cut short, or a pack around a non-list.
    good = encode_packed([_codec.encode(_good(rng, 0))])
    for data in (value, good[:rng.randint(0, len(good))],
                 msgspec.msgpack.encode({"requests": value})):
        try:
            items = unpack_requests(data)
        except DecodeError as e:
            assert e.reason in ("empty", "too_large", "malformed", "invalid")
            event(e.reason)
            continue
        assert items  # a pack that decodes has at least one item
        event("decoded")


@fuzz_settings(1_000)
@given(case=_PACKS)
def test_the_intake_holds_a_packs_good_requests_and_dead_letters_each_bad_one(case):
    seed, n, bad_at = case
    data, reqs, values = _pack_of(seed, n, bad_at)
    svc, producer = _scheduler()
    intake = svc.intake
    with _quiet(intake_module):
        _LOOP.run_until_complete(intake._take(_TP, _tier_record(data, _PACK_HEADERS, 7)))
    letters = [codec_for(DeadLetter).decode(v) for t, v in producer.sent
               if t == TOPICS.dead_letters]
    if len(data) > CONFIG.service.max_message_bytes:
        # Larger than admission ever packs: the whole record is one dead letter.
        [letter] = letters
        assert (letter.reason, letter.payload, svc.core.held) == ("too_large", data, 0)
        event("pack too large")
        return
    good = [r for r in reqs if r is not None]
    assert svc.core.held == len(good)
    assert all(intake.owns(r.id) for r in good)
    assert sorted(x.payload for x in letters) == sorted(values[i] for i in bad_at)
    # The record's offset stays uncommitted until its last held request is done.
    if good:
        for r in good:
            assert intake.offsets.committable(_TP) == 7
            intake.release(r.id)
    assert intake.offsets.committable(_TP) == 8  # past the record: every request is done
    event(f"{len(bad_at)} bad of {n}")


def test_a_pack_of_a_version_this_reader_does_not_know_is_dead_lettered_whole():
    rng = random.Random(3)
    data = encode_packed([_codec.encode(_good(rng, i)) for i in range(3)])
    svc, producer = _scheduler()
    with _quiet(intake_module):
        _LOOP.run_until_complete(svc.intake._take(_TP, _tier_record(
            data, [("content-type", b"application/msgpack"), ("sf-pack", b"2")], 0)))
    assert svc.core.held == 0
    [letter] = [codec_for(DeadLetter).decode(v) for t, v in producer.sent
                if t == TOPICS.dead_letters]
    assert letter.reason == "unsupported_pack" and letter.payload == data
