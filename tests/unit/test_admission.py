"""The admission decision: every outcome, every refusal reason, and the order of checks."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from producer.admission import Admitted, DeadLetterReason, Refused, decide
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from schemas.codec import DecodeError, codec_for, format_from_headers
from schemas.messages import EmbedInput, LaneState, Request, RequestId, SchedulerState
from tests.admission_setup import NOW_MS, make_config, request_dict, request_json
from tokens.counting import load_token_counter

CFG = make_config()
COUNTER = load_token_counter("fake")
MSGPACK = [("content-type", b"application/msgpack")]


def run(value, headers=None, *, ts_ms=NOW_MS - 5, limiter=None, throttle=None, counter=COUNTER,
        now_ms=NOW_MS, config=CFG):
    return decide(value, headers, ts_ms, config, limiter or RateLimiter(config),
                  throttle or ThrottleState(), counter, now_ms)


def refused(value, **kw) -> Refused:
    out = run(value, **kw)
    assert isinstance(out, Refused), out
    return out


def assert_refusal(out: Refused, status: str, reason: str, *in_message: str) -> None:
    r = out.result
    assert (r.status, r.reason) == (status, reason), r
    for part in in_message:
        assert part in r.message, (part, r.message)


# -- admitted ----------------------------------------------------------------


def test_plain_json_without_headers_is_admitted_with_registry_values():
    """JSON with no headers (as kcat sends) is admitted to the org's tier topic, all resolved."""
    out = run(request_json(deadline_ms=3000, created_ms=NOW_MS - 100, priority=2))
    assert isinstance(out, Admitted)
    a = out.request
    assert out.topic == "sf.requests.free"
    assert (a.tier, a.tokens, a.priority) == ("free", 2, 2)
    assert a.created_ms == NOW_MS - 100 and a.deadline_at_ms == NOW_MS + 2900
    assert a.admitted_ms == NOW_MS
    assert a.reply_to == "sf.results" and a.reply_format == "json"


def test_msgpack_by_header_replies_in_msgpack_to_its_reply_topic():
    """A msgpack record (by content-type) is admitted with reply_format msgpack and its reply_to."""
    body = msgspec.msgpack.encode(request_dict(reply_to="sf.replies.svc-1"))
    out = run(body, MSGPACK)
    assert isinstance(out, Admitted)
    assert out.request.reply_format == "msgpack" and out.request.reply_to == "sf.replies.svc-1"


def test_created_ms_falls_back_to_record_timestamp_then_now():
    """Without created_ms the deadline counts from the record timestamp, or from now."""
    out = run(request_json(deadline_ms=1000), ts_ms=NOW_MS - 300)
    assert out.request.created_ms == NOW_MS - 300 and out.request.deadline_at_ms == NOW_MS + 700
    out = run(request_json(deadline_ms=1000), ts_ms=None)
    assert out.request.created_ms == NOW_MS and out.request.deadline_at_ms == NOW_MS + 1000


def test_rerank_tokens_count_query_with_each_document():
    """Rerank cost is the (query, document) pairs' tokens; the registry's tier is used."""
    body = request_json(org="acme", endpoint="rerank",
                        input={"type": "rerank", "query": "a b", "documents": ["c", "d e"]})
    out = run(body)
    assert isinstance(out, Admitted)
    assert out.request.tokens == (2 + 1) + (2 + 2) and out.topic == "sf.requests.enterprise"


def test_admission_charges_the_limiter_and_counts_for_overload():
    """Only an admitted request charges the rate limit and counts towards overload."""
    limiter, throttle = RateLimiter(CFG), ThrottleState()
    run(request_json(), limiter=limiter, throttle=throttle)
    assert limiter.keys == 1 and throttle.admitted_since == 1


# -- dead letters -------------------------------------------------------------


@pytest.mark.parametrize("value", [b"\xff\x00garbage", b"", b"[1, 2]", b'{"id": 12}', None])
def test_undecodable_without_a_readable_id_is_only_dead_lettered(value):
    """Bytes with no readable request id go to the dead letters with no result."""
    out = run(value)
    assert isinstance(out, DeadLetterReason) and out.result is None and out.error


def test_undecodable_with_an_id_also_gets_an_invalid_result():
    """A schema failure with a readable id: dead letter plus an invalid result naming the field."""
    body = msgspec.json.encode({"id": "r-9", "org": "trial", "reply_to": "sf.replies.a",
                                "endpoint": "embed", "input": {"type": "embed", "texts": "x"}})
    out = run(body)
    assert isinstance(out, DeadLetterReason) and out.reason == "invalid"
    assert out.reply_to == "sf.replies.a" and out.result.id == "r-9"
    assert out.result.status == "invalid" and out.result.reason == "decode_error"
    assert "input.texts" in out.result.message


def test_salvaged_result_with_a_bad_reply_to_goes_to_the_results_topic():
    """An id is enough: a disallowed or absent reply_to sends the result to sf.results."""
    out = run(b'{"id": "r-2", "reply_to": "elsewhere", "org": 5}')
    assert isinstance(out, DeadLetterReason) and out.reply_to == "sf.results"
    assert out.result.org == ""


def test_unsupported_content_type_is_dead_lettered():
    """An unknown content-type is a dead letter whose error names the type."""
    out = run(request_json(), [("content-type", b"text/xml")])
    assert isinstance(out, DeadLetterReason) and out.reason == "bad_content_type"
    assert "text/xml" in out.error and out.result is not None and out.result.id == "r-1"


def test_a_broken_token_counter_fails_one_request_not_the_loop():
    """An exception inside the decision becomes a dead letter and a failed result."""

    class Broken:
        def count(self, texts):
            raise RuntimeError("tokenizer exploded")

    out = run(request_json(), counter=Broken())
    assert isinstance(out, DeadLetterReason) and out.reason == "admission_error"
    assert out.result.status == "failed" and "tokenizer exploded" in out.result.message


def decode_failure(value: bytes, headers) -> str | None:
    """The codec's reason for not decoding ``value`` as a Request (None: it decodes)."""
    try:
        codec_for(Request).decode(value, format_from_headers(headers))
    except DecodeError as e:
        return e.reason
    return None


def readable_id(value: bytes, fmt: str) -> str | None:
    """The request id a schema failure still shows (what admission answers), else None."""
    try:
        obj = msgspec.json.decode(value) if fmt == "json" else msgspec.msgpack.decode(value)
        return msgspec.convert(obj.get("id"), RequestId) if isinstance(obj, dict) else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def assert_decided(out, value: bytes, headers) -> str | None:
    """What the codec refuses is dead-lettered with the codec's reason, answered invalid when
    an id is readable; what it accepts is admitted or refused. Never an admission error."""
    reason = decode_failure(value, headers)
    event(f"decoded: {reason is None}")
    if reason is None:
        assert isinstance(out, Admitted | Refused), out
        return None
    assert isinstance(out, DeadLetterReason) and out.reason == reason, out
    try:
        fmt = format_from_headers(headers)
    except DecodeError:
        fmt = "json"  # what admission reads a record with an unusable content-type as
    rid = readable_id(value, fmt)
    if rid is None:
        assert out.result is None, out
    else:
        assert (out.result.id, out.result.status, out.result.reason) == (
            rid, "invalid", "decode_error"), out
    return reason


@given(value=st.binary(max_size=300),
       headers=st.lists(st.tuples(st.sampled_from(["content-type", "x"]),
                                  st.binary(max_size=30)), max_size=2))
def test_any_bytes_are_dead_lettered_with_the_codecs_reason(value, headers):
    """Bytes the codec refuses become a dead letter with its reason, never an admission error."""
    assert_decided(run(value, headers), value, headers)


def expected_refusal(req: Request, size: int) -> tuple[str, str] | None:
    """(status, reason) the documented order of checks gives a decoded request of the test
    registry, from a fresh limiter and no snapshot (created_ms from the record, NOW_MS - 5);
    None: admitted. Written from the table in ``producer/admission.py``, not from its code."""
    org, ep = CFG.orgs.get(req.org), CFG.endpoints.get(req.endpoint)
    kind = "embed" if isinstance(req.input, EmbedInput) else "rerank"
    texts = req.input.texts if kind == "embed" else req.input.documents
    # The fake counter counts words; rerank pairs the query with each document.
    q = len(req.input.query.split()) if kind == "rerank" else 0
    tokens = max(1, sum(q + len(t.split()) for t in texts))
    allowed = req.reply_to is None or req.reply_to == "sf.results" or (
        req.reply_to.startswith("sf.replies.") and len(req.reply_to) > len("sf.replies."))
    checks = (  # each evaluated only once the ones before it passed
        (lambda: org is None, "unknown_org"),
        (lambda: ep is None, "unknown_endpoint"),
        (lambda: ep.kind != kind, "input_kind_mismatch"),
        (lambda: req.tier is not None, "tier_not_allowed"),
        (lambda: req.weight is not None, "weight_not_allowed"),
        (lambda: req.priority > CFG.priority_cap(org.tier, req.endpoint), "priority_above_cap"),
        (lambda: not allowed, "reply_topic_not_allowed"),
        (lambda: len(texts) > ep.max_texts, "too_many_texts"),
        (lambda: any(len(t) > ep.max_text_chars for t in texts)
         or (kind == "rerank" and len(req.input.query) > ep.max_text_chars), "text_too_long"),
        (lambda: size > CFG.service.max_message_bytes, "message_too_large"),
        (lambda: tokens > ep.max_request_tokens, "too_many_tokens"),
    )
    for failed, answer in checks:
        if failed():
            return "invalid", answer
    if req.deadline_ms is not None and NOW_MS - 5 + req.deadline_ms <= NOW_MS:
        return "expired", "deadline_passed"
    # A fresh limiter refuses only what can never fit: the free tier's rerank (0 a minute;
    # vip-trial's own limit is on embed). Embed's 40 tokens a minute is above its
    # max_request_tokens, so no valid embed request reaches it.
    if org.tier == "free" and kind == "rerank":
        return "rejected", "rate_limited"
    return None


_HOSTILE_VALUES = st.one_of(
    st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
    st.lists(st.text(max_size=4), max_size=3),
    st.fixed_dictionaries({"type": st.sampled_from(["embed", "x"]),
                           "texts": st.lists(st.text(max_size=9))}))
_WORDS = st.lists(st.sampled_from(["a", "bb", "hello", "w" * 60]), max_size=25).map(" ".join)
#: Per field, values of the right type that each pass or fail one check.
_PLAUSIBLE = {
    "id": st.sampled_from(["r-2", "r.3:x", "x" * 129, "bad id"]),
    "org": st.sampled_from(["trial", "acme", "vip-trial", "nobody"]),
    "endpoint": st.sampled_from(["embed", "rerank", "nope"]),
    "input": st.one_of(
        st.fixed_dictionaries({"type": st.just("embed"), "texts": st.lists(_WORDS, max_size=6)}),
        st.fixed_dictionaries({"type": st.just("rerank"), "query": _WORDS,
                               "documents": st.lists(_WORDS, max_size=6)})),
    "priority": st.integers(-1, 12),
    "deadline_ms": st.integers(-10, 10_000),
    "reply_to": st.sampled_from(["sf.results", "sf.replies.a", "sf.replies.", "elsewhere",
                                 "sf.requests.free"]),
    "tier": st.sampled_from(["free", "enterprise"]),
    "weight": st.sampled_from([1, 2.5]),
}
#: Up to four fields replaced, each by a plausible value three times in four.
_OVERRIDES = st.lists(st.tuples(st.sampled_from(sorted(_PLAUSIBLE)), st.integers(0, 3)).flatmap(
    lambda ki: st.tuples(st.just(ki[0]), _PLAUSIBLE[ki[0]] if ki[1] else _HOSTILE_VALUES)),
    max_size=4).map(dict)


@given(_OVERRIDES)
def test_any_request_like_object_gets_the_answer_of_its_first_failed_check(overrides):
    """A valid request with up to four fields replaced: the codec's dead letter, or the answer
    of the first check it fails in the documented order, or admitted."""
    fields = {k: v for k, v in {**request_dict(), **overrides}.items() if v is not None}
    for fmt, enc in (("json", msgspec.json.encode), ("msgpack", msgspec.msgpack.encode)):
        headers = MSGPACK if fmt == "msgpack" else None
        value = enc(fields)
        out = run(value, headers)
        if assert_decided(out, value, headers) is not None:
            continue
        want = expected_refusal(codec_for(Request).decode(value, fmt), len(value))
        event(f"{fmt}: {want[1] if want else 'admitted'}")
        if want is None:
            assert isinstance(out, Admitted), out
        else:
            assert isinstance(out, Refused), out
            assert (out.result.status, out.result.reason) == want, (out, fields)


# -- invalid -------------------------------------------------------------------


def test_unknown_org():
    """An org outside the registry is invalid/unknown_org, answered on its reply topic."""
    out = refused(request_json(org="nobody", reply_to="sf.replies.x"))
    assert_refusal(out, "invalid", "unknown_org", "'nobody'")
    assert out.reply_to == "sf.replies.x" and out.result.id == "r-1"


def test_unknown_endpoint():
    """An endpoint not configured is invalid/unknown_endpoint, listing the endpoints."""
    assert_refusal(refused(request_json(endpoint="generate")), "invalid", "unknown_endpoint",
                   "'generate'", "embed, rerank")


def test_input_kind_must_match_the_endpoint():
    """Rerank input on an embed endpoint is invalid/input_kind_mismatch."""
    body = request_json(input={"type": "rerank", "query": "q", "documents": ["d"]})
    assert_refusal(refused(body), "invalid", "input_kind_mismatch", "embed endpoint", "'rerank'")


def test_claimed_tier_and_weight_are_refused():
    """tier and weight come from the registry: claiming either is invalid."""
    assert_refusal(refused(request_json(tier="enterprise")), "invalid", "tier_not_allowed",
                   "'tier'", "'free'")
    assert_refusal(refused(request_json(weight=9.0)), "invalid", "weight_not_allowed", "'weight'")


def test_priority_above_the_tiers_cap():
    """Priority above the tier's cap is invalid, and the message names the cap."""
    out = refused(request_json(priority=3))
    assert_refusal(out, "invalid", "priority_above_cap", "priority 3", "cap of 2", "'free'")
    assert isinstance(run(request_json(priority=2)), Admitted)


def test_reply_topic_outside_the_prefix():
    """A reply_to outside sf.replies. is invalid, answered on the shared results topic."""
    out = refused(request_json(reply_to="other.topic"))
    assert_refusal(out, "invalid", "reply_topic_not_allowed", "'other.topic'", "'sf.replies.'")
    assert out.reply_to == "sf.results"
    assert_refusal(refused(request_json(reply_to="sf.replies.")), "invalid",
                   "reply_topic_not_allowed")


def test_too_many_texts():
    """More texts than max_texts is invalid and says both numbers."""
    body = request_json(input={"type": "embed", "texts": ["a"] * 5})
    assert_refusal(refused(body), "invalid", "too_many_texts", "input.texts has 5",
                   "max_texts = 4")


def test_text_too_long_names_the_text():
    """A text over max_text_chars is invalid and names its index; a rerank query too."""
    body = request_json(input={"type": "embed", "texts": ["ok", "x" * 51]})
    assert_refusal(refused(body), "invalid", "text_too_long", "input.texts[1] has 51",
                   "max_text_chars = 50")
    body = request_json(org="acme", endpoint="rerank",
                        input={"type": "rerank", "query": "q" * 51, "documents": ["d"]})
    assert_refusal(refused(body), "invalid", "text_too_long", "input.query")


def test_message_too_large():
    """A record over service.max_message_bytes is invalid and says the limit."""
    body = request_json(id="r-" + "x" * 100, input={"type": "embed", "texts": ["a"]},
                        reply_to="sf.replies." + "p" * 200)
    cfg = make_config(max_message_bytes=200)
    assert_refusal(refused(body, config=cfg), "invalid", "message_too_large",
                   "max_message_bytes = 200")


def test_too_many_tokens():
    """A request over max_request_tokens is invalid and carries its token count."""
    body = request_json(input={"type": "embed", "texts": [" ".join(["w"] * 21)]})
    out = refused(body)
    assert_refusal(out, "invalid", "too_many_tokens", "21 tokens", "max_request_tokens = 20")
    assert out.result.tokens == 21


# -- expired / rejected ------------------------------------------------------------


def test_deadline_already_passed_is_expired():
    """A deadline that passed before admission gives an expired result."""
    out = refused(request_json(created_ms=NOW_MS - 2000, deadline_ms=1000))
    assert_refusal(out, "expired", "deadline_passed", "deadline_ms = 1000", "1000 ms before")


def test_rate_limited_with_retry_after():
    """Past the free tier's 3 per minute: rejected/rate_limited with the window and retry-after."""
    limiter = RateLimiter(CFG)
    for i in range(3):
        assert isinstance(run(request_json(id=f"r{i}"), limiter=limiter), Admitted)
    out = refused(request_json(), limiter=limiter)
    assert_refusal(out, "rejected", "rate_limited", "3 requests per 60 s", "'trial'")
    assert out.result.retry_after_ms == 20_000


def test_request_that_can_never_fit_a_window_has_no_retry_after():
    """A closed endpoint (limit 0) is rate_limited with no retry_after_ms."""
    body = request_json(endpoint="rerank", input={"type": "rerank", "query": "q",
                                                  "documents": ["d"]})
    out = refused(body)
    assert_refusal(out, "rejected", "rate_limited", "can never fit")
    assert out.result.retry_after_ms is None


def _state(held_requests=0, tokens_per_s=1.0) -> SchedulerState:
    lane = LaneState(endpoint="embed", held_requests=held_requests, held_cost_by_tier={},
                     held_tokens_by_tier={"enterprise": 10_000}, tokens_per_s=tokens_per_s,
                     free_slots=0, workers=1)
    return SchedulerState(sent_ms=NOW_MS, lanes={"embed": lane}, held_requests=held_requests)


def test_overloaded():
    """At max_held_requests the request is rejected/overloaded with a retry-after."""
    throttle = ThrottleState()
    throttle.observe(_state(held_requests=100), NOW_MS)
    out = refused(request_json(), throttle=throttle)
    assert_refusal(out, "rejected", "overloaded", "max_held_requests = 100")
    assert out.result.retry_after_ms > 0


def test_throttled_and_not_charged():
    """A predicted wait past the latency target is rejected/throttled and costs no rate limit."""
    throttle, limiter = ThrottleState(), RateLimiter(CFG)
    throttle.observe(_state(), NOW_MS)
    out = refused(request_json(), throttle=throttle, limiter=limiter)
    assert_refusal(out, "rejected", "throttled", "predicted wait", "latency_target_ms = 1000")
    assert out.result.retry_after_ms > 0
    assert limiter.keys == 0 and throttle.admitted_since == 0


# -- order -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"org": "nobody", "endpoint": "nope"}, "unknown_org"),
        ({"endpoint": "nope", "tier": "x"}, "unknown_endpoint"),
        ({"tier": "x", "priority": 50}, "tier_not_allowed"),
        ({"priority": 50, "reply_to": "bad"}, "priority_above_cap"),
        ({"reply_to": "bad", "input": {"type": "embed", "texts": ["a"] * 9}},
         "reply_topic_not_allowed"),
        ({"input": {"type": "embed", "texts": ["w " * 30]}, "created_ms": 1, "deadline_ms": 1},
         "text_too_long"),
        ({"input": {"type": "embed", "texts": ["w " * 21]}, "created_ms": 1, "deadline_ms": 1},
         "too_many_tokens"),
    ],
)
def test_first_failing_check_decides(fields, reason):
    """When several checks fail, the earliest in the documented order is reported."""
    assert refused(request_json(**fields)).result.reason == reason


def test_deadline_is_checked_before_rate_limits_and_rate_limits_before_throttle():
    """expired beats rate_limited; rate_limited beats overloaded."""
    limiter = RateLimiter(CFG)
    for i in range(3):
        run(request_json(id=f"r{i}"), limiter=limiter)
    late = request_json(created_ms=NOW_MS - 2000, deadline_ms=1000)
    assert refused(late, limiter=limiter).result.reason == "deadline_passed"
    throttle = ThrottleState()
    throttle.observe(_state(held_requests=1000), NOW_MS)
    out = refused(request_json(), limiter=limiter, throttle=throttle)
    assert out.result.reason == "rate_limited"
