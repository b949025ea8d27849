"""What admission writes for one org's admitted requests of a step: packs, in order."""

from hypothesis import given
from hypothesis import strategies as st

from producer.service import _packed, _Send
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, EmbedInput
from schemas.packs import PACK_HEADER, is_pack, unpack_requests

_codec = codec_for(AdmittedRequest)

def _send(i: int, words: int = 1) -> _Send:
    req = AdmittedRequest(id=f"r{i}", org="acme", endpoint="embed", tier="standard",
                          input=EmbedInput(texts=(" ".join(["w"] * words),)), tokens=words,
                          created_ms=1, admitted_ms=1, reply_to="sf.results")
    return _Send("sf.requests.standard", _codec.encode(req), b"acme",
                 [("content-type", b"application/msgpack")], "admitted", record=f"rec{i}",
                 admitted=req, tp=0, last=True)

def _ids(s: _Send) -> list[str]:
    if is_pack(s.headers):
        return [item.value.id for item in unpack_requests(s.value)]
    return [_codec.decode(s.value).id]

def test_one_orgs_requests_of_a_step_are_one_record_in_their_order():
    sends = [_send(i) for i in range(5)]
    [pack] = _packed(sends, 1 << 20)
    assert PACK_HEADER in pack.headers and pack.key == b"acme"
    assert _ids(pack) == [f"r{i}" for i in range(5)]
    assert pack.members == sends  # released (or failed) one by one with it

def test_a_request_alone_stays_a_plain_record():
    [one] = _packed([_send(0)], 1 << 20)
    assert not is_pack(one.headers) and one.members is None and _ids(one) == ["r0"]

@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(200, 5000))
def test_packs_stay_within_their_bytes_and_keep_every_request_once_in_order(words, limit):
    sends = [_send(i, w) for i, w in enumerate(words)]
    out = _packed(sends, limit)
    assert [i for s in out for i in _ids(s)] == [f"r{i}" for i in range(len(words))]
    for s in out:
        # Over the limit only as a request alone, which is no pack.
        assert len(s.value) <= limit + 64 or not is_pack(s.headers)
        if is_pack(s.headers):
            assert sum(len(m.value) for m in s.members) <= limit
