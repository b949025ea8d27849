"""Packed replies, the worker's side: results of senders that asked, several to a record.

:func:`worker.replies.replies` groups a micro-batch's results by (reply
topic, format), splits a group at ``max_bytes`` and leaves plain records
where nobody asked; the service counts, fails and commits by result, each
taking its record's outcome. The client's side is in
``test_client_packed_replies.py``.
"""

from __future__ import annotations

import pytest

from plumbing.kafka import KafkaSettings
from schemas.build import build_config
from schemas.codec import codec_for, format_from_headers
from schemas.messages import AdmittedRequest, EmbedInput, Result
from schemas.packs import PACK_HEADER, encode_results, is_pack, pack_frame_bytes, unpack_results
from worker.execute import Served
from worker.replies import replies
from worker.service import WorkerService, WorkerSettings

_result = codec_for(Result)
_MSGPACK = [("content-type", b"application/msgpack")]
_JSON = [("content-type", b"application/json")]


def served(i: int, *, packed: bool = True, fmt: str = "msgpack", topic: str = "sf.replies.c",
           dim: int = 4) -> Served:
    req = AdmittedRequest(id=f"r{i}", org="acme", endpoint="embed", tier="gold",
                          input=EmbedInput(texts=(f"text {i}",)), tokens=2, created_ms=1,
                          admitted_ms=2, reply_to=topic, reply_format=fmt, reply_packed=packed)
    res = Result(id=req.id, status="ok", org="acme", endpoint="embed",
                 embeddings=[[0.25 * k for k in range(dim)]], batch_id="b", worker="w")
    return Served(req, res, 0.001)


def read_back(reply) -> list[Result]:
    """The results a reply record carries, as a reader decodes them."""
    fmt = format_from_headers(reply.headers)
    if is_pack(reply.headers):
        items = unpack_results(reply.value, fmt)
        assert all(it.error is None for it in items)
        return [it.value for it in items]
    return [_result.decode(reply.value, fmt)]


# -- the worker: grouping and splitting --------------------------------------------


def test_results_nobody_packed_stay_one_record_each_as_before():
    """Without reply_packed: one plain record per result, keyed by its id, its own encoding."""
    done = [served(0, packed=False), served(1, packed=False, fmt="json"),
            served(2, packed=False, topic="sf.results")]
    out = replies(done, 1 << 20)
    assert [r.members for r in out] == [[s] for s in done]
    for r, s in zip(out, done, strict=True):
        assert r.topic == s.request.reply_to and r.key == s.result.id.encode()
        assert not is_pack(r.headers)
        assert r.value == _result.encode(s.result, s.request.reply_format)
        assert r.headers == (_JSON if s.request.reply_format == "json" else _MSGPACK)


def test_one_pack_per_reply_topic_and_format_a_result_alone_stays_plain():
    """Packed results of one micro-batch group by (reply topic, format); plain ones stay plain."""
    done = [served(0), served(1, fmt="json"), served(2), served(3, packed=False),
            served(4, fmt="json"), served(5, topic="sf.replies.other"), served(6)]
    out = replies(done, 1 << 20)
    shapes = {(r.topic, r.headers[0][1], r.packed): [s.result.id for s in r.members]
              for r in out}
    assert shapes == {
        ("sf.replies.c", b"application/msgpack", False): ["r3"],
        ("sf.replies.c", b"application/msgpack", True): ["r0", "r2", "r6"],
        ("sf.replies.c", b"application/json", True): ["r1", "r4"],
        ("sf.replies.other", b"application/msgpack", False): ["r5"],
    }
    for r in out:
        assert is_pack(r.headers) == r.packed
        assert r.key == (None if r.packed else r.members[0].result.id.encode())
        assert [x.id for x in read_back(r)] == [s.result.id for s in r.members]
        assert read_back(r) == [s.result for s in r.members]


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_a_large_group_is_split_each_pack_within_the_limit_nothing_lost_or_twice(fmt):
    """Every limit from one result's size to all of them: packs fit, each result once, in order."""
    done = [served(i, fmt=fmt, dim=1 + i % 7) for i in range(40)]
    one = max(len(_result.encode(s.result, fmt)) for s in done)
    everything = sum(len(_result.encode(s.result, fmt)) for s in done) + pack_frame_bytes(40)
    for max_bytes in sorted({one, one + 1, 2 * one, 3 * one + 7, 5 * one, 1000, 4096,
                             everything - 1, everything}):
        out = replies(done, max_bytes)
        assert all(len(r.value) <= max_bytes for r in out), max_bytes
        ids = [x.id for r in out for x in read_back(r)]
        assert ids == [s.result.id for s in done], max_bytes
        assert [s for r in out for s in r.members] == done
    assert len(replies(done, everything)) == 1
    assert len(replies(done, everything - 1)) == 2


def test_a_result_larger_than_any_pack_goes_alone_as_a_plain_record():
    """A result over the limit is still written (alone, as today); its neighbours are packed."""
    done = [served(0), served(1, dim=400), served(2), served(3)]
    big = len(_result.encode(done[1].result, "msgpack"))
    out = replies(done, big - 1)
    assert [[s.result.id for s in r.members] for r in out] == [["r0"], ["r1"], ["r2", "r3"]]
    assert [r.packed for r in out] == [False, False, True]


def test_the_msgpack_pack_is_the_schema_packs_own():
    """The worker's msgpack pack is byte for byte what schemas.packs encodes for those results."""
    done = [served(i) for i in range(3)]
    (pack,) = replies(done, 1 << 20)
    assert pack.value == encode_results([s.result for s in done], "msgpack")
    assert pack.headers == [*_MSGPACK, PACK_HEADER]


# -- the worker service: each record's outcome is each of its results' -----------------


class _Outbox:
    def __init__(self):
        self.added: list[tuple] = []

    def add(self, topic, value, *, key=None, partition=None, headers=()):
        self.added.append((topic, value, key, headers))


class _Written:
    def __init__(self, outcomes):
        self._outcomes = outcomes

    async def outcomes(self):
        return self._outcomes


def worker() -> WorkerService:
    config = build_config(prefix="sf.", endpoints={"embed": {"model": "fake"}},
                          orgs={"acme": "gold"}, max_message_bytes=1200).config
    svc = WorkerService(config, KafkaSettings(bootstrap="127.0.0.1:1"),
                        WorkerSettings(endpoint="embed", model="fake", worker_id="w"))
    svc._outbox = _Outbox()
    return svc


async def test_publish_queues_one_outbox_record_per_reply_within_the_configured_limit():
    """_publish writes what replies() makes, in its order: outcomes zip with records."""
    svc = worker()
    done = [served(i, dim=20) for i in range(12)] + [served(12, packed=False)]
    records = svc._publish(done)
    assert len(svc._outbox.added) == len(records) < len(done)
    for (topic, value, key, headers), r in zip(svc._outbox.added, records, strict=True):
        assert (topic, value, key, headers) == (r.topic, r.value, r.key, r.headers)
        assert len(value) <= 1200
    assert sorted(s.result.id for r in records for s in r.members) == sorted(
        s.result.id for s in done)


async def test_an_acknowledged_pack_counts_each_result_a_refused_one_fails_each():
    """Acks and errors are per record; counting and the commit decision are per result."""
    svc = worker()
    counted: list[str] = []
    svc._results_written = lambda ok, now: counted.extend(s.result.id for s in ok)
    first = svc._publish([served(i, dim=20) for i in range(6)])
    second = svc._publish([served(10, packed=False), served(11), served(12)])
    assert [r.packed for r in first] == [True, True] and [r.packed for r in second] == [
        False, True]
    boom = RuntimeError("refused")
    ok = await svc._await_sends([(first, _Written([None, boom])),
                                 (second, _Written([None, None]))])
    assert ok is False, "a refused pack leaves the batch uncommitted"
    assert counted == [s.result.id for s in first[0].members] + ["r10", "r11", "r12"]
    failed = svc.registry.get_sample_value("sf_worker_failures_total",
                                           {"endpoint": "embed", "reason": "result_send"})
    assert failed == len(first[1].members), "each result of the refused pack is one failure"

    counted.clear()
    assert await svc._await_sends([(first, _Written([None, None]))]) is True
    assert sorted(counted) == [f"r{i}" for i in range(6)]


async def test_outcomes_that_do_not_match_the_records_are_an_error_not_a_guess():
    """The strict zip holds per record: a pack's one outcome is not read as its first result's."""
    svc = worker()
    svc._results_written = lambda ok, now: None
    records = svc._publish([served(i) for i in range(3)])
    assert len(records) == 1
    with pytest.raises(ValueError):
        await svc._await_sends([(records, _Written([None, None, None]))])
