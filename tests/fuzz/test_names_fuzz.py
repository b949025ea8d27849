"""Names checked after decoding (``schemas/names.py``) accept and reject exactly what the
strict decoder does.

A pack is decoded whole with its requests' names unchecked, then each name is
checked against its field's pattern (the org, endpoint and reply topic once
per distinct value). Properties:

* a pack decodes to exactly what decoding each item strictly gives: the same
  requests, and for a request with a bad name the same error (its reason
  and message), whatever mix of good and bad names it holds;
* a decoded request is an ``AdmittedRequest``, equal (both ways, ``==`` and
  ``!=``) to the one packed, and encodes to the same bytes.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from schemas import names
from schemas.codec import DecodeError, codec_for
from schemas.messages import AdmittedRequest, EmbedInput
from schemas.names import KNOWN_MAX, names_ok
from schemas.packs import encode_packed, unpack_requests
from tests.fuzz.hostile import fuzz_settings

_codec = codec_for(AdmittedRequest)
_INPUT = msgspec.to_builtins(EmbedInput(texts=("hi",)))
_FIELDS = ("id", "org", "endpoint", "reply_to")

#: Names that pass every pattern, and strings close to them that do not (a
#: trailing newline is what "$" instead of "\\Z" would let through).
_GOOD = st.sampled_from(["a", "acme", "sf.replies.x", "quiet-1", "r_1.2"])
_BAD = st.sampled_from(["a\n", "a b", "acme\u00e9", "x/y", "", "a\x00", "\u0661"])
_ODD = st.one_of(_BAD, st.text(min_size=0, max_size=6),
                 st.sampled_from(["a:b", "id:1"]))  # ":" is legal in an id only
#: A request's names: all good, or one of them (any) drawn from the odd ones.
_NAMES = st.builds(lambda good, field, odd: good | ({field: odd} if field else {}),
                   st.fixed_dictionaries({f: _GOOD for f in ("id", "org", "endpoint",
                                                             "reply_to")}),
                   st.sampled_from([None, None, "id", "org", "endpoint", "reply_to"]), _ODD)


def _item(values: dict[str, str]) -> bytes:
    """One AdmittedRequest's bytes with ``values`` for its names (no validation)."""
    fields = {"id": "r1", "org": "acme", "endpoint": "embed", "tier": "t0",
              "input": _INPUT, "tokens": 2, "created_ms": 1, "admitted_ms": 1,
              "reply_to": "sf.replies.x"} | values
    return msgspec.msgpack.encode(fields)


def _strictly(value: bytes) -> AdmittedRequest | tuple[str, str]:
    try:
        return _codec.decode(value)
    except DecodeError as e:
        return e.reason, str(e)


_PACK = st.lists(_NAMES, min_size=1, max_size=5)


@fuzz_settings(2_000)
@given(pack=_PACK)
def test_a_pack_decodes_to_what_each_item_decoded_strictly_gives(pack):
    values = [_item(v) for v in pack]
    items = unpack_requests(encode_packed(values))
    assert len(items) == len(values)
    for i, (item, value) in enumerate(zip(items, values, strict=True)):
        strict = _strictly(value)
        if isinstance(strict, AdmittedRequest):
            assert item.error is None and item.value == strict
            assert _codec.encode(item.value) == _codec.encode(strict)
        else:
            assert item.value is None and item.error is not None
            reason, message = strict
            assert (item.error.reason, str(item.error)) == (reason, f"requests[{i}]: {message}")
    event(f"{sum(i.error is not None for i in items)} bad of {len(items)}")


def test_a_decoded_request_is_one_equal_to_the_one_packed():
    req = AdmittedRequest(id="r1", org="acme", endpoint="embed", tier="t0",
                          input=EmbedInput(texts=("hi",)), tokens=2, created_ms=1,
                          admitted_ms=1, reply_to="sf.replies.x")
    [item] = unpack_requests(encode_packed([_codec.encode(req)]))
    got = item.value
    assert isinstance(got, AdmittedRequest) and type(got) is not AdmittedRequest
    # != is its own method: it must say the same, both ways.
    assert got == req and req == got and (got != req) is False and (req != got) is False
    other = msgspec.structs.replace(req, tokens=3)
    assert got != other and other != got and (got == other) is False
    assert repr(got).startswith("AdmittedRequest(")
    assert _codec.encode(got) == _codec.encode(req)


@pytest.mark.parametrize("field", _FIELDS)
def test_each_name_is_checked_against_its_own_pattern(field):
    bad = "x\n"
    req = msgspec.msgpack.decode(_item({field: bad}), type=names.LooseAdmitted)
    assert not names_ok([req])
    assert names_ok([msgspec.msgpack.decode(_item({}), type=names.LooseAdmitted)])


def test_a_repeated_name_is_checked_once_and_the_memory_is_bounded(monkeypatch):
    calls: dict[str, int] = {f: 0 for f in _FIELDS}
    searches = dict(names._search)

    def counting(field):
        def search(value):
            calls[field] += 1
            return searches[field](value)
        return search

    monkeypatch.setattr(names, "_search", {f: counting(f) for f in _FIELDS})
    monkeypatch.setattr(names, "_known", {f: set() for f in names._known})
    reqs = [msgspec.msgpack.decode(_item({"id": f"r{i}", "org": "o1"}), type=names.LooseAdmitted)
            for i in range(50)]
    assert names_ok(reqs)
    assert calls == {"id": 50, "org": 1, "endpoint": 1, "reply_to": 1}
    many = [msgspec.msgpack.decode(_item({"org": f"o{i}"}), type=names.LooseAdmitted)
            for i in range(KNOWN_MAX + 10)]
    assert names_ok(many)
    assert len(names._known["org"]) <= KNOWN_MAX
