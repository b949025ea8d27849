"""Fuzzing admission's backlog records (``producer/backlog.py``).

Properties:

* the decoder raises nothing but ``ValueError`` (the service dead-letters the
  record whole on it), whatever the bytes or the msgpack structure;
* what it returns round-trips: every record encoded comes back, in order,
  with its key, value, headers and timestamp.

2,000 examples each (a fifth of the ingress fuzz's): the decoder is one msgspec
call over a small fixed shape.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
from hypothesis import event, given
from hypothesis import strategies as st

from producer.backlog import BACKLOG_HEADER, BackRecord, decode, encode
from tests.fuzz.hostile import fuzz_settings

_MSGPACK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


class _Rec(NamedTuple):
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


_RECS = st.lists(st.builds(
    _Rec, st.none() | st.binary(max_size=30), st.binary(max_size=200),
    st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=10)), max_size=3).map(tuple),
    st.integers(0, 2**63 - 1)), max_size=30)


def _decode_or_refuse(value, headers) -> list[BackRecord] | None:
    try:
        return decode("sf.backlog", 0, 7, value, headers)
    except ValueError:
        return None


@fuzz_settings(2_000)
@given(st.binary(max_size=400) | _MSGPACK.map(msgspec.msgpack.encode),
       st.sampled_from([[BACKLOG_HEADER], [], [("sf-backlog", b"2")], [BACKLOG_HEADER] * 2]))
def test_the_decoder_refuses_with_a_value_error_only(value, headers):
    got = _decode_or_refuse(value, headers)
    event("refused" if got is None else f"{len(got) > 0} records")
    if got is not None:
        assert all(isinstance(r, BackRecord) and isinstance(r.value, bytes) for r in got)


@fuzz_settings(2_000)
@given(_RECS)
def test_every_record_comes_back_whole_and_in_order(recs):
    got = decode("sf.backlog", 3, 9, encode(recs), [BACKLOG_HEADER])
    assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == [tuple(r) for r in recs]
