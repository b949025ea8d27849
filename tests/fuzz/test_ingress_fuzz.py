"""Hostile input on the ingress topic: admission's decide() against the trust rules.

Two kinds of fuzzing, each 10,000 cases by default (``tests/fuzz/hostile.py``,
``fuzz_cases``): raw bytes with any headers and any record timestamp, where only
the invariants can be checked; and valid requests with exactly one thing wrong,
where the answer is known in advance and must be exactly that (its reason code,
its dead-letter reason, its reply address). Deterministic hostile records
(10,000-level nesting, msgpack bombs, a 10 MB message) are checked one by one.

The invariants, for every outcome:

* decide() returns exactly one of Admitted / Refused / DeadLetterReason and
  never raises, nor fails internally (``admission_error``);
* an Admitted request obeys every trust rule: the org is in the registry and
  its tier comes from there, no tier or weight was claimed, priority <= the
  tier's cap, the reply topic is allowed, texts, characters, bytes and tokens
  are within the endpoint's limits, and the message round-trips through the
  codec the scheduler reads it with;
* a Refused result has a status, a reason and a message, and goes only to an
  allowed reply topic; so does a dead letter's salvaged result.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

from producer.admission import Admitted, DeadLetterReason, Refused, decide
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from schemas.codec import DecodeError, codec_for, format_from_headers
from schemas.messages import AdmittedRequest, EmbedInput, Request, Result
from schemas.topics import Topics
from tests.fuzz.hostile import (
    BOMBS,
    CONFIG,
    NOW_MS,
    RESULTS,
    Case,
    allowed_reply_topic,
    deep_value,
    fuzz_settings,
    hostile_bytes,
    hostile_headers,
    mutated_case,
    record_timestamps,
    valid_request_id,
)
from tokens.counting import load_token_counter

COUNTER = load_token_counter("fake")
TOPICS = Topics.of(CONFIG)
INVALID_REASONS = {
    "unknown_org", "unknown_endpoint", "input_kind_mismatch", "tier_not_allowed",
    "weight_not_allowed", "priority_above_cap", "reply_topic_not_allowed", "too_many_texts",
    "text_too_long", "message_too_large", "too_many_tokens",
}
REJECTED_REASONS = {"rate_limited", "overloaded", "throttled"}
DEAD_REASONS = {"empty", "too_large", "malformed", "invalid", "bad_content_type"}
_admitted_codec = codec_for(AdmittedRequest)
_result_codec = codec_for(Result)


def _lenient(value: bytes | None, headers) -> dict:
    """The record's top-level object, read with no schema (last duplicate wins)."""
    try:
        fmt = format_from_headers(headers)
        obj = msgspec.json.decode(value) if fmt == "json" else msgspec.msgpack.decode(value)
    except Exception:  # noqa: BLE001 - anything unreadable has no fields
        return {}
    return obj if isinstance(obj, dict) else {}


def check_outcome(out, value: bytes | None, headers, *, now_ms: int = NOW_MS) -> None:
    """The invariants every decision must satisfy, whatever the input."""
    assert type(out) in (Admitted, Refused, DeadLetterReason), out
    if isinstance(out, Admitted):
        _check_admitted(out, value, headers, now_ms)
    elif isinstance(out, Refused):
        r = out.result
        assert allowed_reply_topic(out.reply_to), out.reply_to
        assert valid_request_id(r.id)
        assert r.reason and r.message, r
        assert out.reply_format == format_from_headers(headers)
        if r.status == "invalid":
            assert r.reason in INVALID_REASONS, r.reason
        elif r.status == "expired":
            assert r.reason == "deadline_passed"
        else:
            assert r.status == "rejected" and r.reason in REJECTED_REASONS, r
        assert r.retry_after_ms is None or r.retry_after_ms >= 1
        _check_result_wire(r, out.reply_format)
    else:
        assert out.reason in DEAD_REASONS, (out.reason, out.error)  # never admission_error
        assert out.error
        if out.result is not None:
            r = out.result
            assert allowed_reply_topic(out.reply_to), out.reply_to
            assert valid_request_id(r.id)
            assert r.status == "invalid" and r.reason == "decode_error" and r.message
            _check_result_wire(r, out.reply_format)


def _check_result_wire(r: Result, fmt: str) -> None:
    """A result must reach its sender readable: it round-trips in its reply format."""
    assert _result_codec.decode(_result_codec.encode(r, fmt), fmt) == r


def _check_admitted(out: Admitted, value: bytes | None, headers, now_ms: int) -> None:
    a = out.request
    org = CONFIG.orgs.get(a.org)
    assert org is not None, a.org
    assert a.tier == org.tier and out.topic == TOPICS.tier(org.tier)
    ep = CONFIG.endpoints[a.endpoint]
    assert a.priority <= CONFIG.priority_cap(org.tier, a.endpoint)
    assert allowed_reply_topic(a.reply_to), a.reply_to
    assert a.reply_format == format_from_headers(headers)
    assert value is not None and len(value) <= CONFIG.service.max_message_bytes
    texts = a.input.texts if isinstance(a.input, EmbedInput) else a.input.documents
    assert (ep.kind == "embed") == isinstance(a.input, EmbedInput)
    assert 1 <= len(texts) <= ep.max_texts
    assert all(len(t) <= ep.max_text_chars for t in texts)
    assert isinstance(a.input, EmbedInput) or len(a.input.query) <= ep.max_text_chars
    assert 1 <= a.tokens <= ep.max_request_tokens
    assert a.admitted_ms == now_ms
    assert a.deadline_at_ms is None or a.deadline_at_ms > now_ms
    raw = _lenient(value, headers)
    assert raw.get("tier") is None and raw.get("weight") is None, raw
    # What the scheduler will read: the admitted message must pass its own schema.
    assert _admitted_codec.decode(_admitted_codec.encode(a)) == a


def _decide(case_value, headers, ts, *, limiter=None, throttle=None, now_ms=NOW_MS):
    return decide(case_value, headers, ts, CONFIG, limiter or RateLimiter(CONFIG),
                  throttle or ThrottleState(), COUNTER, now_ms)


def check_expectation(out, case: Case) -> None:
    """The one answer a single known fault must get."""
    e = case.expect
    if e is None:
        return
    if e.kind == "admitted":
        assert isinstance(out, Admitted), out
    elif e.kind == "refused":
        assert isinstance(out, Refused), out
        assert (out.result.status, out.result.reason) == (e.status, e.reason), out.result
    else:
        assert isinstance(out, DeadLetterReason), out
        assert out.reason in e.reasons, (out.reason, out.error)
        if e.result is True:
            assert out.result is not None, out
            assert out.reply_to == e.reply_to, (out.reply_to, e.reply_to)
        elif e.result is False:
            assert out.result is None, out


# -- the properties ----------------------------------------------------------------


@fuzz_settings()
@given(raw=hostile_bytes(), headers=hostile_headers(), ts=record_timestamps())
def test_any_record_gets_exactly_one_trustworthy_outcome(raw, headers, ts):
    """For any bytes, headers and timestamp, decide() returns one outcome obeying the trust rules."""
    value = raw.value()
    note(f"value: {value if value is None or len(value) <= 300 else value[:300] + b'...'!r}")
    out = _decide(value, headers, ts)
    event(type(out).__name__)
    check_outcome(out, value, headers)


@fuzz_settings()
@given(case=mutated_case())
def test_one_wrong_field_gets_its_own_reason(case):
    """A valid request with one thing wrong gets exactly that thing's answer, and nothing else."""
    event(case.label)
    out = _decide(case.value, case.headers, case.timestamp_ms)
    check_outcome(out, case.value, case.headers)
    check_expectation(out, case)


_LIMITER = RateLimiter(CONFIG)
_THROTTLE = ThrottleState()
#: The shared limiter's clock: it only moves forward, across examples too.
_CLOCK = [NOW_MS]


@fuzz_settings(1_000)
@given(cases=st.lists(st.one_of(mutated_case(), st.tuples(
    hostile_bytes(), hostile_headers(), record_timestamps())), min_size=1, max_size=8),
    step_ms=st.integers(0, 120_000))
def test_shared_limiter_and_throttle_survive_hostile_sequences(cases, step_ms):
    """Hostile records through one long-lived limiter and throttle keep every outcome trustworthy."""
    for case in cases:
        if not isinstance(case, Case):
            raw, headers, ts = case
            case = Case(raw.value(), headers, ts, None, "raw")
        _CLOCK[0] += step_ms
        now = _CLOCK[0]
        out = _decide(case.value, case.headers, case.timestamp_ms, limiter=_LIMITER,
                      throttle=_THROTTLE, now_ms=now)
        check_outcome(out, case.value, case.headers, now_ms=now)
        assert not (isinstance(out, DeadLetterReason) and out.reason == "admission_error")


# -- deterministic hostile records -----------------------------------------------------

_GOOD = (b'{"id": "r-1", "org": "acme", "endpoint": "embed", '
         b'"input": {"type": "embed", "texts": ["hello world"]}')


@pytest.mark.parametrize("depth", [1_000, 10_000, 100_000, 1_000_000])
@pytest.mark.parametrize("objects", [False, True])
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_deep_nesting_is_dead_lettered(depth, objects, fmt):
    """A record nested 1,000 to 1,000,000 levels deep (whole or in one field) is a dead letter."""
    nested = deep_value(depth, objects)
    headers = [("content-type", b"application/msgpack")] if fmt == "msgpack" else None
    whole = nested.json if fmt == "json" else nested.mp
    out = _decide(whole, headers, NOW_MS)
    check_outcome(out, whole, headers)
    assert isinstance(out, DeadLetterReason) and out.result is None
    if fmt == "json":
        inside = _GOOD + b', "x": ' + nested.json + b"}"
        out = _decide(inside, None, NOW_MS)
        check_outcome(out, inside, None)
        assert isinstance(out, DeadLetterReason) and out.reason == "malformed"


@pytest.mark.parametrize("bomb", BOMBS)
def test_msgpack_bombs_are_dead_lettered_without_allocating(bomb):
    """A msgpack length header claiming billions of elements is a dead letter, not an allocation."""
    headers = [("content-type", b"application/msgpack")]
    for value in (bomb, b"\x81\xa2id" + bomb, b"\x82\xa2id\xa3r-1\xa5input" + bomb):
        out = _decide(value, headers, NOW_MS)
        check_outcome(out, value, headers)
        assert isinstance(out, DeadLetterReason) and out.reason in ("invalid", "malformed")


@pytest.mark.parametrize("size", [2_001, 1 << 20, 10 << 20])
def test_oversized_message_is_refused_with_the_limit(size):
    """A well-formed request over service.max_message_bytes is invalid/message_too_large."""
    value = _GOOD + b', "padding": "' + b"p" * size + b'"}'
    out = _decide(value, None, NOW_MS)
    check_outcome(out, value, None)
    assert isinstance(out, Refused) and out.result.reason == "message_too_large"
    assert "max_message_bytes = 2000" in out.result.message


@pytest.mark.parametrize("field", [
    b'"weight": NaN', b'"priority": Infinity', b'"priority": 1e400', b'"weight": -1e400',
    b'"priority": 1180591620717411303424', b'"created_ms": -1', b'"deadline_ms": 0',
    b'"created_ms": 100000000000001', b'"deadline_ms": -Infinity',
])
def test_hostile_numbers_never_reach_the_pipeline(field):
    """NaN, Infinity, 1e400, 2**70, -1 and 0 where a bounded number belongs are dead letters."""
    value = _GOOD + b", " + field + b"}"
    out = _decide(value, None, NOW_MS)
    check_outcome(out, value, None)
    assert isinstance(out, DeadLetterReason)


def test_codec_raises_only_decode_error_on_hostile_bytes():
    """The ingress codec turns every hostile record above into DecodeError, never another error."""
    codec = codec_for(Request)
    for value in [*BOMBS, b"\xff" * 10, b"[" * 100_000, b'{"a":' * 100_000, b"", None]:
        for fmt in ("json", "msgpack"):
            with pytest.raises(DecodeError):
                codec.decode(value, fmt)


# -- what the fuzzing found, kept as fixed examples ----------------------------------


@pytest.mark.parametrize(("value", "ts"), [
    (_GOOD + b', "deadline_ms": 1}', 10**14),
    (_GOOD + b', "deadline_ms": 1}', 2**63 - 1),
    (_GOOD + b', "deadline_ms": 86400000, "created_ms": 100000000000000}', NOW_MS),
    (_GOOD + b"}", -(2**63)),
])
def test_admitted_timestamps_stay_within_the_schema(value, ts):
    """A sender's record timestamp or created_ms never pushes created/deadline past EpochMs."""
    out = _decide(value, None, ts)
    check_outcome(out, value, None)  # includes the AdmittedRequest round-trip
    assert isinstance(out, Admitted)


@pytest.mark.parametrize("reply_to", [
    "sf.replies.\u00fc/../x", "sf.replies." + "x" * 300, "sf.replies.x\n", "sf.replies.a b",
])
def test_salvaged_result_never_goes_to_an_illegal_topic(reply_to):
    """A record failing the schema with an illegal reply_to is answered on the results topic."""
    value = msgspec.json.encode({"id": "r-9", "org": 5, "reply_to": reply_to})
    out = _decide(value, None, NOW_MS)
    check_outcome(out, value, None)
    assert isinstance(out, DeadLetterReason) and out.reply_to == RESULTS


@pytest.mark.parametrize("field", ["id", "org", "endpoint", "reply_to"])
def test_a_trailing_newline_is_not_an_identifier(field):
    """'x\\n' passes a '^...$' pattern in Python: it must fail the schema everywhere."""
    fields = {"id": "r-1", "org": "acme", "endpoint": "embed", "reply_to": "sf.replies.a",
              "input": {"type": "embed", "texts": ["a"]}}
    fields[field] += "\n"
    value = msgspec.json.encode(fields)
    out = _decide(value, None, NOW_MS)
    check_outcome(out, value, None)
    assert isinstance(out, DeadLetterReason) and out.reason == "invalid", out


@pytest.mark.parametrize("top_n", [2**63, 2**64, 10**30])
def test_an_integer_beyond_64_bits_is_not_admitted(top_n):
    """JSON carries any integer, msgpack only 64 bits: admitting top_n=10**30 broke the send."""
    value = msgspec.json.encode({"id": "r-1", "org": "acme", "endpoint": "rerank", "input": {
        "type": "rerank", "query": "q", "documents": ["d"], "top_n": top_n}})
    out = _decide(value, None, NOW_MS)
    check_outcome(out, value, None)
    assert isinstance(out, DeadLetterReason) and out.reason == "invalid"
