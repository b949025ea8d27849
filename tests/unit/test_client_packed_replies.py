"""Packed replies, the client's side: its reader reads plain results and packs alike.

Each result of a pack is delivered as if it came alone (to its waiter, to
``results()``, or counted as a copy); a bad item is skipped and logged like
a bad plain record, and so is a pack that cannot be read at all: the reader
never stops. The client asks for packs on the reply topic it reads.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from plumbing.kafka import KafkaSettings
from producer.client import FairnessClient, results_in
from schemas.codec import DecodeError, codec_for, format_from_headers
from schemas.messages import EmbedInput, Request, Result
from schemas.packs import PACK_HEADER, encode_packed, encode_results

_result = codec_for(Result)
_MSGPACK = [("content-type", b"application/msgpack")]
_JSON = [("content-type", b"application/json")]


# -- reading both forms --------------------------------------------------


def good(i: int) -> Result:
    return Result(id=f"g{i}", status="ok", embeddings=[[1.0, 2.0]])


def test_results_in_reads_plain_records_and_packs_in_both_encodings():
    plain = results_in(_result.encode(good(0), "json"), _JSON)
    assert plain == [good(0)]
    for fmt, ct in (("json", _JSON), ("msgpack", _MSGPACK)):
        got = results_in(encode_results([good(1), good(2)], fmt), [*ct, PACK_HEADER])
        assert got == [good(1), good(2)]


def test_a_bad_item_of_a_pack_is_an_error_in_its_place_the_others_stand():
    bad = msgspec.msgpack.encode({"id": 5, "status": "ok"})
    value = encode_packed([_result.encode(good(1)), bad, _result.encode(good(2))],
                          field="results")
    got = results_in(value, [*_MSGPACK, PACK_HEADER])
    assert got[0] == good(1) and got[2] == good(2)
    assert isinstance(got[1], DecodeError) and got[1].reason == "invalid"
    json_value = b'{"results":[' + _result.encode(good(3), "json") + b',{"id":[]},' + \
        _result.encode(good(4), "json") + b"]}"
    got = results_in(json_value, [*_JSON, PACK_HEADER])
    assert [type(g) for g in got] == [Result, DecodeError, Result]


@pytest.mark.parametrize(("value", "headers"), [
    (b"\xc1 not msgpack", [*_MSGPACK, PACK_HEADER]),
    (msgspec.msgpack.encode({"results": []}), [*_MSGPACK, PACK_HEADER]),
    (msgspec.msgpack.encode({"requests": [1]}), [*_MSGPACK, PACK_HEADER]),
    (None, [*_MSGPACK, PACK_HEADER]),
    (encode_results([good(1)]), [*_MSGPACK, ("sf-pack", b"2")]),
    (b"{}", [("content-type", b"text/plain")]),
    (b"\xc1", _MSGPACK),
])
def test_an_unreadable_record_or_pack_is_one_error_never_raised(value, headers):
    got = results_in(value, headers)
    assert len(got) == 1 and isinstance(got[0], DecodeError)


def record(value, headers, offset=0):
    return SimpleNamespace(topic="sf.replies.c", partition=0, offset=offset, timestamp=None,
                           value=value, headers=headers)


async def test_the_client_delivers_each_result_of_a_pack_as_if_it_came_alone():
    """Mixed forms, a bad item, an unreadable pack, a copy in a pack: each id once, in order."""
    client = FairnessClient(KafkaSettings(bootstrap="127.0.0.1:1"), "sf.")
    bad = msgspec.msgpack.encode({"status": "ok"})
    waiting = asyncio.get_running_loop().create_future()
    client._waiters["g3"] = waiting
    records = [
        record(_result.encode(good(0), "json"), _JSON, 0),
        record(encode_packed([_result.encode(good(1)), bad, _result.encode(good(2)),
                              _result.encode(good(3))], field="results"),
               [*_MSGPACK, PACK_HEADER], 1),
        record(b"\xc1\xc1", [*_MSGPACK, PACK_HEADER], 2),
        record(encode_results([good(4), good(0)], "json"), [*_JSON, PACK_HEADER], 3),
        record(_result.encode(good(5)), _MSGPACK, 4),
    ]
    for rec in records:
        client._take(rec)
    assert list(client._ready) == ["g0", "g1", "g2", "g4", "g5"]
    assert waiting.done() and waiting.result() == good(3), "a waiter gets its result from a pack"
    assert client.duplicates == 1, "g0 again, inside a pack, is a copy like any other"
    got = []
    async for res in client.results():
        got.append(res.id)
        if len(got) == 5:
            break
    assert got == ["g0", "g1", "g2", "g4", "g5"]


# -- asking for packs ------------------------------------------------------


class _Producer:
    def __init__(self):
        self.sent: list[Request] = []

    async def send_and_wait(self, topic, value, *, key=None, headers=()):
        self.sent.append(codec_for(Request).decode(value, format_from_headers(headers)))


async def _submitted(client: FairnessClient, request) -> Request:
    client._producer = _Producer()
    await client.submit(request)
    return client._producer.sent[-1]


async def test_the_client_asks_for_packs_on_its_own_reply_topic_only():
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")
    body = {"org": "acme", "endpoint": "embed", "input": {"type": "embed", "texts": ["x"]}}
    own = FairnessClient(kafka, "sf.")
    assert (await _submitted(own, body)).reply_packed is True
    req = Request(id="q", org="acme", endpoint="embed", input=EmbedInput(texts=("x",)))
    assert (await _submitted(own, req)).reply_packed is True
    # Another reply topic: the request says, not this client (it does not read it).
    elsewhere = await _submitted(own, {**body, "reply_to": "sf.replies.else"})
    assert elsewhere.reply_packed is False
    assert (await _submitted(own, {**body, "reply_to": "sf.replies.else",
                                   "reply_packed": True})).reply_packed is True
    # Off: never on its own topic, even when a request asks.
    off = FairnessClient(kafka, "sf.", packed_replies=False)
    assert (await _submitted(off, {**body, "reply_packed": True})).reply_packed is False
    # A given topic of its own (the gateway's): packed; the shared results topic: never.
    given = FairnessClient(kafka, "sf.", "sf.replies.gateway-x")
    req = Request(id="q", org="acme", endpoint="embed", input=EmbedInput(texts=("x",)),
                  reply_to=given.reply_topic)
    assert (await _submitted(given, req)).reply_packed is True
    shared = FairnessClient(kafka, "sf.", "sf.results")
    assert (await _submitted(shared, body)).reply_packed is False
