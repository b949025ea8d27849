"""Hostile records on the internal topics: their decoders and the code right behind them.

For ``AdmittedRequest`` (tier topics), ``Batch`` (batch topics), ``WorkerEvent``
and ``SchedulerState``, 10,000 cases each by default (``tests/fuzz/hostile.py``,
``fuzz_cases``): raw bytes, message-shaped values with hostile leaves, valid
encodings damaged at the byte level, one field of a valid message replaced by a
hostile value, 200,000-level nesting, msgpack bombs, any headers. The codec must
raise nothing but ``DecodeError``; what it does accept must re-encode to the
same message; and every valid message must round-trip in both encodings (JSON
only with finite floats: JSON has no NaN).

Then what consumes those messages, fed with whatever the decoders let through:

* the worker's :class:`~worker.execute.BatchExecutor` (batch -> one result per
  request), with a model that explodes on some texts: no exception escapes, each
  request gets exactly one terminal result, a failure stays with its request;
* the scheduler's tier intake (record -> held, duplicate or dead letter) and the
  core behind it: no exception, nothing sent to an illegal or disallowed topic,
  and the next batch always comes back (a poisoned token count must not spin DRR);
* the scheduler's worker-slot registry (:class:`~scheduler.flow.FlowControl`)
  and cost feedback, from worker events.

Both scheduler parts run the service's own per-record code
(:class:`~scheduler.service.SchedulerService`, never started, with a fake
producer): ``intake._take`` for a tier record, ``_existing_partitions`` then
``_observe`` for a decoded worker event, as its loops call them;
* admission's throttle, from scheduler-state snapshots: no snapshot can make
  admission fail a request instead of deciding it.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import event, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings
from producer.admission import Admitted, DeadLetterReason, Refused, decide
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from scheduler import intake as intake_module
from scheduler import service as service_module
from scheduler.service import SchedulerService
from schemas.codec import DecodeError, codec_for
from schemas.messages import (
    TERMINAL_STATUSES,
    AdmittedRequest,
    Batch,
    DeadLetter,
    EmbedInput,
    LaneState,
    RerankInput,
    Result,
    SchedulerState,
    WorkerEvent,
)
from schemas.topics import Topics
from tests.admission_setup import registry
from tests.fuzz.hostile import BOMBS, EVIL_STRINGS, NOW_MS, allowed_reply_topic, fuzz_settings
from tests.fuzz.internal import (
    BUILDERS,
    KINDS,
    admitted_from,
    encode_as,
    event_from,
    hostile_record,
    hostile_record_from,
    int64_from,
    state_from,
    text_from,
)
from tokens.counting import load_token_counter
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder
from worker.interface import CosineReranker

# The admission registry, with the rerank endpoint on the adaptive cost model so
# that worker timings feed a cost that could be poisoned.
CONFIG = registry(endpoints={"rerank": {"cost_model": "adaptive", "quantum": 128}}).config
TOPICS = Topics.of(CONFIG)
_SEEDS = st.integers(0, 2**64 - 1)
def _valid_record(typ: type, seed: int) -> tuple[Any, bytes, list, str]:
    rng = random.Random(seed)
    fmt = rng.choice(["json", "msgpack"])
    msg = BUILDERS[typ](rng, fmt == "json")  # JSON has no NaN or infinity
    headers = [("content-type", b"application/json" if fmt == "json" else b"application/msgpack")]
    return msg, codec_for(typ).encode(msg, fmt), headers, fmt


def check_decoder(typ: type, value: bytes | None, headers: Any) -> Any:
    """Decode as a consumer of ``typ``'s topic does: a ``typ`` or DecodeError, nothing else;
    whatever it accepts re-encodes to itself."""
    codec = codec_for(typ)
    try:
        msg = codec.decode_record(value, headers, max_bytes=1 << 20)
    except DecodeError as e:
        assert e.reason in ("empty", "too_large", "malformed", "invalid", "bad_content_type")
        event("DecodeError")
        return None
    assert type(msg) is typ
    again = codec.encode(msg)
    assert codec.encode(codec.decode(again)) == again
    event("decoded")
    return msg


def _round_trip(typ: type, seed: int) -> Any:
    msg, data, headers, fmt = _valid_record(typ, seed)
    back = codec_for(typ).decode_record(data, headers)
    # Bytes, not ==: NaN != NaN, yet a NaN that comes back is a correct round trip.
    assert codec_for(typ).encode(back, fmt) == data, (msg, back)
    return back


_DECODER_TYPES = [AdmittedRequest, Batch, WorkerEvent, SchedulerState]


def _decoder_case_from(typ: type, kind: str, seed: int) -> tuple:
    return ("valid", seed) if kind == "valid" else hostile_record_from(typ, kind, seed)


def decoder_cases(typ: type) -> st.SearchStrategy[tuple]:
    """A quarter valid messages (``("valid", seed)``), the rest hostile records of 7 kinds."""
    kinds = st.sampled_from(KINDS * 3 + ["valid"] * 7)
    return st.tuples(kinds, _SEEDS).map(lambda ks: _decoder_case_from(typ, *ks))


def _decoder_case(typ: type, case: tuple) -> None:
    if case[0] == "valid":
        _round_trip(typ, case[1])
        event("valid")
        return
    value, headers, kind = case
    event(kind)
    check_decoder(typ, value, headers)


@fuzz_settings()
@given(case=decoder_cases(AdmittedRequest))
def test_admitted_request_decoder_raises_only_decode_error_and_round_trips(case):
    """AdmittedRequest (tier topics): any record decodes or raises DecodeError; valid ones round-trip."""
    _decoder_case(AdmittedRequest, case)


@fuzz_settings()
@given(case=decoder_cases(Batch))
def test_batch_decoder_raises_only_decode_error_and_round_trips(case):
    """Batch (batch topics): any record decodes or raises DecodeError; valid ones round-trip."""
    _decoder_case(Batch, case)


@fuzz_settings()
@given(case=decoder_cases(WorkerEvent))
def test_worker_event_decoder_raises_only_decode_error_and_round_trips(case):
    """WorkerEvent: any record decodes or raises DecodeError; valid ones round-trip."""
    _decoder_case(WorkerEvent, case)


@fuzz_settings()
@given(case=decoder_cases(SchedulerState))
def test_scheduler_state_decoder_raises_only_decode_error_and_round_trips(case):
    """SchedulerState: any record decodes or raises DecodeError; valid ones round-trip."""
    _decoder_case(SchedulerState, case)


@pytest.mark.parametrize("typ", _DECODER_TYPES)
@pytest.mark.parametrize("value", [*BOMBS, b"[" * 200_000, b'{"a":' * 200_000, b"\x91" * 200_000,
                                   b"", None, b"\xc1", b"null", b"x" * (2 << 20)])
def test_fixed_hostile_records_raise_decode_error(typ, value):
    """Bombs, 200,000-level nesting, an unused msgpack byte, null and 2 MiB of junk: DecodeError."""
    for headers in (None, [("content-type", b"application/msgpack")]):
        with pytest.raises(DecodeError):
            codec_for(typ).decode_record(value, headers, max_bytes=1 << 20)


# -- the worker: a decoded batch in, one result per request out -----------------------------


class _Exploding(FakeEmbedder):
    """A fake model that raises on texts containing BOOM (and its tokenizer on TOKBOOM)."""

    def token_lengths(self, texts):
        if any("TOKBOOM" in t for t in texts):
            raise RuntimeError("tokenizer exploded")
        return super().token_lengths(texts)

    def encode(self, texts, *, lengths=None):
        if any("BOOM" in t for t in texts):
            raise ValueError("model exploded")
        return super().encode(texts, lengths=lengths)


_LOOP = asyncio.new_event_loop()
_EXECUTORS = {
    "embed": BatchExecutor(_Exploding(), "embed", worker="w", max_padded_tokens=64, max_size=4,
                           inline=True),
    "rerank": BatchExecutor(CosineReranker(_Exploding()), "rerank", worker="w",
                            max_padded_tokens=64, max_size=4, inline=True),
}


def _poisoned_batch(rng: random.Random) -> Batch:
    """A batch that passes the schema but carries every kind of trouble."""
    reqs = []
    for _ in range(rng.randint(0, 6)):
        r = admitted_from(rng)
        poison = rng.choice(["none", "boom", "tokboom", "empty", "long", "many", "dup"])
        field = "texts" if isinstance(r.input, EmbedInput) else "documents"
        texts = list(getattr(r.input, field))
        if poison == "boom":
            texts[rng.randrange(len(texts))] += " BOOM"
        elif poison == "tokboom":
            texts[rng.randrange(len(texts))] += " TOKBOOM"
        elif poison == "empty":
            texts[:] = [""] * len(texts)
        elif poison == "long":
            texts[0] = " ".join(["w"] * rng.choice([300, 3_000]))
        elif poison == "many":
            texts.extend(["a b"] * 150)
        if poison == "dup" and reqs:
            r = reqs[-1]
        else:
            r = msgspec.structs.replace(
                r, input=msgspec.structs.replace(r.input, **{field: tuple(texts)}))
        # Far from now either way, so that expiry is decided by the data, not the clock.
        r = msgspec.structs.replace(r, deadline_at_ms=rng.choice([None, 1, NOW_MS * 10]))
        reqs.append(r)
    return Batch(id=text_from(rng, 10), endpoint="embed", requests=reqs, tokens=int64_from(rng),
                 created_ms=NOW_MS)


async def _serve_all(executor: BatchExecutor, batch: Batch) -> list:
    out = []
    async for done in executor.serve(batch):
        out.extend(done)
    return out


@fuzz_settings(5_000)
@given(seed=_SEEDS, kind=st.sampled_from(["embed", "rerank"]), record=hostile_record(Batch))
def test_worker_answers_every_request_of_any_decodable_batch_once(seed, kind, record):
    """A poisoned batch yields one terminal result per request; failures stay with their request."""
    value, headers, _ = record
    decoded = check_decoder(Batch, value, headers)
    batch = decoded if decoded is not None and random.Random(seed).random() < 0.3 \
        else _poisoned_batch(random.Random(seed))
    served = _LOOP.run_until_complete(_serve_all(_EXECUTORS[kind], batch))
    # One result per request, in any order (a duplicated request answers twice).
    assert Counter(id(s.request) for s in served) == Counter(id(r) for r in batch.requests)
    for s in served:
        req, res = s.request, s.result
        assert res.id == req.id and res.status in TERMINAL_STATUSES
        event(res.status)
        texts = req.input.texts if isinstance(req.input, EmbedInput) else req.input.documents
        kind_ok = (kind == "embed") == isinstance(req.input, EmbedInput)
        expired = req.deadline_at_ms is not None and req.deadline_at_ms <= time.time() * 1000
        boom = any("BOOM" in t for t in texts) or (
            isinstance(req.input, RerankInput) and "BOOM" in req.input.query)
        if expired:
            assert res.status == "expired"
        elif not kind_ok:
            assert res.status == "invalid"
        elif boom:
            assert res.status == "failed", res  # contained: only its own request fails
        else:
            assert res.status == "ok", res
        if res.status == "ok" and res.embeddings is not None:
            assert len(res.embeddings) == len(texts)
            assert np.isfinite(np.asarray(res.embeddings, dtype=np.float64)).all()
        if res.status == "ok" and res.scores is not None:
            assert len(res.scores) == len(texts)
            top_n = req.input.top_n or len(texts)
            assert sorted(res.ranking) == sorted(set(res.ranking))
            assert len(res.ranking) == min(top_n, len(texts))
        # The sender can read it: the result round-trips in the request's encoding.
        fmt = req.reply_format
        assert codec_for(Result).decode(codec_for(Result).encode(res, fmt), fmt) == res


# -- the scheduler: tier records in, held / duplicate / dead letter out ---------------------


class _FakeProducer:
    """Records what the service would write; every write succeeds. Batch topics have the
    configured partitions."""

    def __init__(self):
        self.sent: list[tuple[str, bytes]] = []
        self.client = self

    async def send_and_wait(self, topic, value=None, key=None, headers=None, partition=None):
        self.sent.append((topic, value))

    async def partitions_for(self, topic):
        return {p for ep, e in CONFIG.endpoints.items() if topic == TOPICS.batches(ep)
                for p in range(e.partitions)}

    def force_metadata_update(self):
        done = _LOOP.create_future()
        done.set_result(True)
        return done


#: Never connected: the per-record code under test needs no broker.
_KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")


def _scheduler() -> tuple[SchedulerService, _FakeProducer]:
    """A scheduler service that is never started, writing to a fake producer."""
    svc = SchedulerService(CONFIG, _KAFKA, registry=CollectorRegistry())
    producer = _FakeProducer()
    svc._producer = svc._batch_producer = svc.intake._producer = producer
    return svc, producer


class _Fuel:
    """A lane's cost model that stops a spinning DRR: every selection evaluates a cost, so
    more evaluations than ``limit`` mean the lane is granting turns without serving."""

    def __init__(self, inner, limit: int):
        self.inner, self.left, self.limit = inner, limit, limit

    def cost(self, e):
        self.left -= 1
        if self.left < 0:
            raise AssertionError(f"DRR spun: {self.limit} cost evaluations without draining")
        return self.inner.cost(e)

    def observe(self, samples):
        self.inner.observe(samples)


_LEGAL_TOPIC = __import__("re").compile(r"[A-Za-z0-9._\-]{1,249}")


def _tier_record(value: bytes | None, headers, offset: int) -> ConsumerRecord:
    return ConsumerRecord(topic=TOPICS.tier("free"), partition=0, offset=offset, timestamp=NOW_MS,
                          timestamp_type=0, key=b"org", value=value, checksum=None,
                          serialized_key_size=3, serialized_value_size=len(value or b""),
                          headers=headers or [])


def _tier_record_from(kind: int, seed: int) -> tuple[bytes | None, Any]:
    rng = random.Random(seed)
    if kind == 0:  # any hostile record
        value, headers, _ = hostile_record_from(AdmittedRequest, rng.choice(KINDS), seed)
        return value, headers
    req = admitted_from(rng)
    if rng.random() < 0.5:  # a plausible one: known endpoint, modest tokens
        req = msgspec.structs.replace(req, endpoint=rng.choice(["embed", "rerank"]),
                                      tokens=rng.randint(1, 20))
    fmt = rng.choice(["json", "msgpack"])
    headers = [("content-type", b"application/msgpack")] if fmt == "msgpack" else None
    if kind == 1:
        return codec_for(AdmittedRequest).encode(req, fmt), headers
    # Unreadable, but with an id and a reply address under the prefix that is not a
    # legal topic name: the sender may be answered, never on that "topic".
    plain = msgspec.to_builtins(req)
    plain["reply_to"] = TOPICS.reply_prefix(CONFIG) + rng.choice(EVIL_STRINGS[1:])
    plain["tokens"] = 0
    return encode_as(plain, fmt), headers


_TIER_RECORDS = st.lists(st.tuples(st.integers(0, 2), _SEEDS).map(
    lambda ks: _tier_record_from(*ks)), min_size=1, max_size=4)


def tier_records() -> st.SearchStrategy[list[tuple[bytes | None, Any]]]:
    """1-4 tier records: hostile, admitted-shaped, or unreadable with an illegal reply_to."""
    return _TIER_RECORDS


class _Quiet:
    """A logger that drops everything: thousands of dead letters need no lines here."""

    def __getattr__(self, name):
        return lambda *a, **k: None


@contextmanager
def _quiet(module):
    saved, module.log = module.log, _Quiet()
    try:
        yield
    finally:
        module.log = saved


@fuzz_settings(4_000)
@given(records=tier_records())
def test_scheduler_intake_survives_any_tier_record(records):
    """Tier records are held, duplicates or dead letters; no illegal send; the core still answers."""
    with _quiet(intake_module):
        _intake_property(records)


def _intake_property(records):
    svc, producer = _scheduler()
    core, intake = svc.core, svc.intake
    allowed_reply = TOPICS.reply_prefix(CONFIG)
    for offset, (value, headers) in enumerate(records):
        before = (core.held, len(producer.sent))
        _LOOP.run_until_complete(intake._take((TOPICS.tier("free"), 0),
                                              _tier_record(value, headers, offset)))
        held, sends = core.held - before[0], len(producer.sent) - before[1]
        dead = [t for t, _ in producer.sent[before[1]:] if t == TOPICS.dead_letters]
        assert (held, len(dead)) in ((1, 0), (0, 1), (0, 0)), (held, producer.sent)
        event("held" if held else "dead letter" if dead else "duplicate")
        for topic, _ in producer.sent[before[1]:]:
            assert _LEGAL_TOPIC.fullmatch(topic), topic
            assert topic == TOPICS.dead_letters or topic == TOPICS.results \
                or (topic.startswith(allowed_reply) and len(topic) > len(allowed_reply)), topic
        assert sends <= 2
    now = time.time()
    for endpoint, lane in core.lanes.items():
        # Each call serves or expires at least one request, within a bounded number of
        # cost evaluations (a token count DRR cannot serve would spin for ever).
        lane.cost = _Fuel(lane.cost, 100 * (lane.held + 1))
        for _ in range(lane.held):
            d = core.next_batch(endpoint, now)
            assert d.batch or d.expired
            for e in d.batch:
                assert e.tokens <= CONFIG.endpoints[endpoint].max_request_tokens
            if not lane.held:
                break
        assert lane.held == 0


# -- the scheduler: worker events in -----------------------------------------------------------


@fuzz_settings(4_000)
@given(seeds=st.lists(_SEEDS, min_size=1, max_size=6), record=hostile_record(WorkerEvent))
def test_worker_events_never_break_slots_or_costs(seeds, record):
    """Any decodable events keep slots non-negative, claims on existing partitions, costs finite."""
    with _quiet(service_module):
        _events_property(seeds, record)


def _events_property(seeds, record):
    svc, _ = _scheduler()
    flow = svc.flow
    now_ms = float(NOW_MS)
    events = [event_from(random.Random(s), finite=False) for s in seeds]
    decoded = check_decoder(WorkerEvent, *record[:2])
    if decoded is not None:
        events.append(decoded)
    for ev in events:
        svc._observe(_LOOP.run_until_complete(svc._existing_partitions(ev)), now_ms)
        for endpoint, ep in CONFIG.endpoints.items():
            claim = flow.claim(endpoint)
            if claim is not None:
                w = flow.workers[claim.worker]
                assert claim.partition in w.partitions and w.free >= 0
                assert 0 <= claim.partition < ep.partitions, claim
                flow.sent(claim.worker, f"b{now_ms}", now_ms)
        for lost in flow.expire(now_ms):
            svc._lost(lost)
        now_ms += 100
    total = svc.rates.total(list(flow.workers))
    assert not math.isnan(total) and total >= 0
    lane = svc.core.lanes["rerank"]
    for org in ("acme", "trial", "x"):
        ratio = lane.cost.ratio(org)
        assert math.isfinite(ratio) and 0.25 <= ratio <= 4.0


# -- admission: scheduler snapshots in, decisions out ----------------------------------------

_COUNTER = load_token_counter("fake")
_GOOD = (b'{"id": "r-1", "org": "%s", "endpoint": "%s", "input": %s}')
_INPUTS = {"embed": b'{"type": "embed", "texts": ["hello world"]}',
           "rerank": b'{"type": "rerank", "query": "q", "documents": ["d"]}'}


@fuzz_settings(4_000)
@given(seeds=st.lists(_SEEDS, min_size=1, max_size=3), record=hostile_record(SchedulerState),
       org=st.sampled_from(["acme", "bulk", "trial"]),
       endpoint=st.sampled_from(["embed", "rerank"]), fmt=st.sampled_from(["json", "msgpack"]))
def test_no_scheduler_snapshot_makes_admission_fail_a_request(seeds, record, org, endpoint, fmt):
    """After any snapshots, admission still decides: admitted or refused with a sane retry-after."""
    throttle = ThrottleState()
    states = [state_from(random.Random(s), finite=False) for s in seeds]
    decoded = check_decoder(SchedulerState, *record[:2])
    if decoded is not None:
        states.append(decoded)
    for state in states:
        throttle.observe(state, NOW_MS)
    value = _GOOD % (org.encode(), endpoint.encode(), _INPUTS[endpoint])
    headers = None
    if fmt == "msgpack":
        value = msgspec.msgpack.encode(msgspec.json.decode(value))
        headers = [("content-type", b"application/msgpack")]
    out = decide(value, headers, NOW_MS, CONFIG, RateLimiter(CONFIG), throttle, _COUNTER, NOW_MS)
    assert not isinstance(out, DeadLetterReason), out
    if isinstance(out, Refused):
        event(out.result.reason)
        r = out.result.retry_after_ms
        assert r is None or (isinstance(r, int) and r >= 1), r
        assert allowed_reply_topic(out.reply_to)
        # The service must be able to write it: msgpack holds no int beyond 64 bits.
        codec_for(Result).encode(out.result, out.reply_format)
    else:
        assert isinstance(out, Admitted)
        event("admitted")


@pytest.mark.parametrize("epoch", [2**62 + 1, 2**63 - 1, 2**64 - 1, 10**30])
def test_a_leader_claim_cannot_push_the_epoch_out_of_int64(epoch):
    """A forged claim beyond 2**62 is undecodable, so the next epoch still packs as '>q'."""
    from scheduler.leader import next_epoch
    from schemas.messages import LeaderClaim

    value = msgspec.json.encode({"instance": "x", "epoch": epoch, "sent_ms": NOW_MS})
    with pytest.raises(DecodeError):
        codec_for(LeaderClaim).decode_record(value, None)
    highest = codec_for(LeaderClaim).decode_record(
        msgspec.json.encode({"instance": "x", "epoch": 2**62, "sent_ms": NOW_MS}), None).epoch
    nxt = next_epoch(NOW_MS, highest)
    __import__("struct").pack(">q", nxt)
    assert codec_for(Batch).decode(codec_for(Batch).encode(
        Batch(id="b", endpoint="embed", requests=[], tokens=0, created_ms=0, epoch=nxt))).epoch == nxt


def test_a_tier_record_above_max_request_tokens_is_dead_lettered():
    """tokens=2**31 on a tier record: a dead letter with too_many_tokens, not a spinning DRR."""
    req = msgspec.structs.replace(admitted_from(random.Random(1)), endpoint="embed",
                                  tokens=2**31, deadline_at_ms=None)
    svc, producer = _scheduler()
    with _quiet(intake_module):
        _LOOP.run_until_complete(svc.intake._take((TOPICS.tier("free"), 0), _tier_record(
            codec_for(AdmittedRequest).encode(req), [("content-type", b"application/msgpack")],
            0)))
    assert svc.core.held == 0
    [letter] = [v for t, v in producer.sent if t == TOPICS.dead_letters]
    assert codec_for(DeadLetter).decode(letter).reason == "too_many_tokens"


@pytest.mark.parametrize("rate", [math.nan, 5e-324, 1e-10, -1.0, math.inf])
def test_a_snapshot_with_an_absurd_rate_leaves_admission_deciding(rate):
    """A NaN, subnormal, negative or infinite service rate: admitted or throttled, never failed."""
    lane = LaneState(endpoint="embed", held_requests=1, held_cost_by_tier={},
                     held_tokens_by_tier={"enterprise": 2**62}, tokens_per_s=rate, free_slots=0,
                     workers=1)
    throttle = ThrottleState()
    throttle.observe(SchedulerState(sent_ms=NOW_MS, lanes={"embed": lane}, held_requests=1),
                     NOW_MS)
    value = _GOOD % (b"bulk", b"embed", _INPUTS["embed"])
    out = decide(msgspec.msgpack.encode(msgspec.json.decode(value)),
                 [("content-type", b"application/msgpack")], NOW_MS, CONFIG, RateLimiter(CONFIG),
                 throttle, _COUNTER, NOW_MS)
    assert isinstance(out, Admitted | Refused), out
    if isinstance(out, Refused):
        assert out.result.reason == "throttled" and 1 <= out.result.retry_after_ms <= 86_400_000
        codec_for(Result).encode(out.result, "msgpack")
