"""A decoded request is invisible to the cyclic garbage collector once it has been seen.

The scheduler holds each request it has read (its ``AdmittedRequest``, the
Entry's payload) until it dispatches it; a full collection walks every tracked
object it holds. Messages are ``gc=False`` structs, and the texts of an input
are a tuple, which the collector untracks at its first pass (a list it walks
for ever: one object per held request, 15-22 ms of a full collection at
100,000 held on the machine of ``docs/benchmarks.md``). These check the
property, not a time.
"""

from __future__ import annotations

import gc

import msgspec
import pytest

from schemas import AdmittedRequest, EmbedInput, RerankInput
from schemas.codec import codec_for
from schemas.packs import encode_requests, unpack_requests

INPUTS = [EmbedInput(texts=("a b", "c")), RerankInput(query="q", documents=("d", "e f"))]


def _admitted(inp) -> AdmittedRequest:
    return AdmittedRequest(id="r1", org="acme", endpoint="embed", tier="t0", input=inp,
                           tokens=3, created_ms=1, admitted_ms=1, reply_to="sf.results")


def _plain(msg: object) -> object:
    return msgspec.json.decode(msgspec.json.encode(msg))


def _walked(req: AdmittedRequest) -> list[object]:
    """What of ``req`` a collection would still walk after one has run."""
    gc.collect()
    inp = req.input
    texts = inp.texts if isinstance(inp, EmbedInput) else inp.documents
    return [o for o in (req, inp, texts) if gc.is_tracked(o)]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
@pytest.mark.parametrize("inp", INPUTS, ids=["embed", "rerank"])
def test_a_decoded_request_is_not_walked(inp, fmt):
    """A request read from one record, in either encoding, holds nothing the collector walks."""
    codec = codec_for(AdmittedRequest)
    req = codec.decode(codec.encode(_admitted(inp), fmt), fmt)
    # Decoded whole, not an empty shell (compared as plain values: lists and tuples alike).
    assert _plain(req) == _plain(_admitted(inp))
    assert _walked(req) == []


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_requests_of_a_pack_are_not_walked(fmt):
    """Each request read from a pack of several holds nothing the collector walks."""
    sent = [_admitted(inp) for inp in INPUTS]
    items = unpack_requests(encode_requests(sent, fmt), fmt)
    got = [it.value for it in items]
    assert _plain(got) == _plain(sent)
    for req in got:
        assert req is not None and _walked(req) == []


def test_an_input_built_with_a_list_holds_a_tuple():
    """A caller that builds an input by hand with a list gets what a decoder makes."""
    embed = EmbedInput(texts=["a", "b"])  # type: ignore[arg-type]  # a list, on purpose
    rerank = RerankInput(query="q", documents=["d"])  # type: ignore[arg-type]
    assert (embed.texts, rerank.documents) == (("a", "b"), ("d",))
    assert _walked(_admitted(embed)) == [] and _walked(_admitted(rerank)) == []
