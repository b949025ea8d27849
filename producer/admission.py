"""The admission decision for one ingress record: admitted, refused, or dead letter.

Pure apart from the two state objects passed in: the rate limiter is charged
and the throttle state counts the request only when the request is admitted.
No I/O, no clock (``now_ms`` is an argument), no logging; the service turns
the returned value into sends, logs and metrics.

Checks, in this order (the first that fails decides the answer):

====  ==============================  =========  ==========================
step  check                           status     reason
====  ==============================  =========  ==========================
1     decode (JSON, or msgpack by     dead       the codec's reason
      the content-type header)        letter     (+ ``invalid`` result if an
                                                 id can be salvaged)
2     org in the registry             invalid    ``unknown_org``
3     endpoint known                  invalid    ``unknown_endpoint``
      input kind fits the endpoint    invalid    ``input_kind_mismatch``
4     no claimed tier / weight        invalid    ``tier_not_allowed`` /
                                                 ``weight_not_allowed``
5     priority <= the tier's cap      invalid    ``priority_above_cap``
6     reply_to under the reply prefix invalid    ``reply_topic_not_allowed``
7     texts per request, characters   invalid    ``too_many_texts``,
      per text, bytes per message                ``text_too_long``,
                                                 ``message_too_large``
8     options fit the endpoint        invalid    ``invalid_option``,
      (:mod:`producer.options`)                  ``unknown_prompt``,
                                                 ``dimensions_too_large``,
                                                 ``input_too_long``
      tokens <= max_request_tokens    invalid    ``too_many_tokens``
9     deadline not passed             expired    ``deadline_passed``
10    rate limits                     rejected   ``rate_limited``
11    scheduler not overloaded        rejected   ``overloaded``
12    predicted wait fits the budget  rejected   ``throttled``
====  ==============================  =========  ==========================

Tokens are what the model computes (:mod:`producer.options`: prompts
included, capped at what the model reads unless ``truncate = "none"``); the
rate limits, the throttle and the scheduler's cost all count them.

A refusal's result goes to the request's ``reply_to`` when that lies under
the allowed prefix (or is the shared results topic), else to the shared
results topic, in the encoding the request came in. A request whose cost
exceeds a whole rate-limit window is ``rejected``/``rate_limited`` with no
``retry_after_ms``: waiting cannot help.

:meth:`Admission.decide` never raises, whatever the bytes: a failure of its own (a
token counter that breaks on some input) becomes a dead letter with reason
``admission_error`` and a ``failed`` result, never a crashed loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, get_args

import msgspec

from producer.options import OptionRefusal, resolve_input
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from schemas.codec import DecodeError, Format, codec_for, format_from_headers
from schemas.config import Config
from schemas.messages import (
    AdmittedRequest,
    EmbedInput,
    EpochMs,
    Request,
    RequestId,
    RerankInput,
    Result,
    Status,
)
from schemas.topics import Topics
from tokens.counting import TokenCounter

__all__ = ["Admission", "Admitted", "DeadLetterReason", "Outcome", "Refused", "decide",
           "reply_topic_for"]

_request_codec = codec_for(Request)
#: The largest epoch-ms value a message may carry (``schemas.messages.EpochMs``).
_EPOCH_MS_MAX: int = get_args(EpochMs)[1].le
#: A legal Kafka topic name (``schemas.messages.TopicName``).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._\-]{1,249}")


class Admitted(msgspec.Struct, frozen=True, kw_only=True):
    """Send ``request`` to ``topic`` (``requests.<tier>``), keyed by its org."""

    request: AdmittedRequest
    topic: str


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """Send ``result`` (``invalid``, ``expired`` or ``rejected``) to ``reply_to``."""

    result: Result
    reply_to: str
    reply_format: Format = "json"


class DeadLetterReason(msgspec.Struct, frozen=True, kw_only=True):
    """Dead-letter the record; when ``result`` is set, also send it to ``reply_to``."""

    reason: str
    error: str
    result: Result | None = None
    reply_to: str | None = None
    reply_format: Format = "json"


Outcome = Admitted | Refused | DeadLetterReason


def reply_topic_for(reply_to: Any, config: Config) -> str:
    """Where a result goes: ``reply_to`` if it is allowed, else the shared results topic."""
    topics = Topics.of(config)
    prefix = topics.reply_prefix(config)
    if isinstance(reply_to, str) and _allowed_reply(reply_to, prefix, topics.results):
        return reply_to
    return topics.results


def _allowed_reply(reply_to: str, prefix: str, results: str) -> bool:
    # A salvaged reply_to was never validated: an illegal name (unicode, "/", too
    # long) under the prefix would block the sending loop for the producer's
    # whole metadata timeout on every attempt, then fail anyway.
    if not _TOPIC_NAME.fullmatch(reply_to):
        return False
    return reply_to == results or (reply_to.startswith(prefix) and len(reply_to) > len(prefix))


class Admission:
    """The decision with the state it charges and consults: rate limits, throttle, counters.

    One per admission instance. The registry is an argument of :meth:`decide`:
    a reload passes the new one, and the service updates the limiter, the
    throttle and the counters in place.
    """

    __slots__ = ("limiter", "throttle_state", "token_counter")

    def __init__(self, limiter: RateLimiter, throttle_state: ThrottleState,
                 token_counter: TokenCounter | Mapping[str, TokenCounter]):
        self.limiter = limiter
        self.throttle_state = throttle_state
        #: One counter for every endpoint, or one per endpoint name.
        self.token_counter = token_counter

    def decide(self, record_value: bytes | None, headers: Any, record_timestamp_ms: int | None,
               config: Config, now_ms: int) -> Outcome:
        """Decide what happens to one ingress record (see the module docstring).

        ``record_timestamp_ms`` (the Kafka record's timestamp) dates a request
        that has no ``created_ms``; ``now_ms`` when it is missing too.
        """
        fmt: Format = "json"
        try:
            fmt = format_from_headers(headers)
            request = _request_codec.decode(record_value, fmt)
        except DecodeError as e:
            return _salvage(record_value, fmt, e.reason, str(e), config)
        except Exception as e:  # noqa: BLE001 - the codec promises DecodeError; bytes are untrusted
            return _salvage(record_value, fmt, "malformed", f"{type(e).__name__}: {e}", config)
        try:
            return self._decide(request, record_value or b"", fmt, record_timestamp_ms, config,
                                now_ms)
        except Exception as e:  # noqa: BLE001 - a bug here must cost one request, not the loop
            return DeadLetterReason(
                reason="admission_error",
                error=f"{type(e).__name__}: {e}",
                result=Result(
                    id=request.id, status="failed", org=request.org, endpoint=request.endpoint,
                    reason="admission_error",
                    message=f"admission failed on this request: {type(e).__name__}: {e}",
                ),
                reply_to=reply_topic_for(request.reply_to, config),
                reply_format=fmt,
            )

    def _decide(self, req: Request, raw: bytes, fmt: Format, record_timestamp_ms: int | None,
                config: Config, now_ms: int) -> Outcome:
        limiter, throttle_state, token_counter = (
            self.limiter, self.throttle_state, self.token_counter)
        topics = Topics.of(config)
        reply_to = reply_topic_for(req.reply_to, config)

        def refuse(status: Status, reason: str, message: str, retry_after_ms: int | None = None,
                   tokens: int | None = None) -> Refused:
            return Refused(
                result=Result(
                    id=req.id, status=status, org=req.org, endpoint=req.endpoint, reason=reason,
                    message=message, retry_after_ms=retry_after_ms, tokens=tokens,
                    created_ms=req.created_ms,
                ),
                reply_to=reply_to,
                reply_format=fmt,
            )

        org = config.orgs.get(req.org)
        if org is None:
            return refuse("invalid", "unknown_org",
                          f"org {req.org!r} is not in the tenant registry")
        ep = config.endpoints.get(req.endpoint)
        if ep is None:
            known = ", ".join(sorted(config.endpoints))
            return refuse("invalid", "unknown_endpoint",
                          f"endpoint {req.endpoint!r} does not exist (endpoints: {known})")
        kind = "embed" if isinstance(req.input, EmbedInput) else "rerank"
        if kind != ep.kind:
            return refuse("invalid", "input_kind_mismatch",
                          f"endpoint {req.endpoint!r} is a {ep.kind} endpoint and needs "
                          f"input.type = {ep.kind!r}, not {kind!r}")
        if req.tier is not None:
            return refuse("invalid", "tier_not_allowed",
                          f"field 'tier' must not be set: an org's tier comes from the tenant "
                          f"registry (org {req.org!r} is {org.tier!r})")
        if req.weight is not None:
            return refuse("invalid", "weight_not_allowed",
                          "field 'weight' must not be set: an org's weight comes from the "
                          "tenant registry")
        cap = config.priority_cap(org.tier, req.endpoint)
        if req.priority > cap:
            return refuse("invalid", "priority_above_cap",
                          f"priority {req.priority} is above the cap of {cap} for tier "
                          f"{org.tier!r} on endpoint {req.endpoint!r}")
        if req.reply_to is not None and req.reply_to != reply_to:
            return refuse("invalid", "reply_topic_not_allowed",
                          f"reply_to {req.reply_to!r} is not allowed: a reply topic must start "
                          f"with {topics.reply_prefix(config)!r} (or be omitted for "
                          f"{topics.results!r})")

        texts = req.input.texts if isinstance(req.input, EmbedInput) else req.input.documents
        field = "input.texts" if isinstance(req.input, EmbedInput) else "input.documents"
        if len(texts) > ep.max_texts:
            return refuse("invalid", "too_many_texts",
                          f"{field} has {len(texts)} entries, the limit of endpoint "
                          f"{req.endpoint!r} is max_texts = {ep.max_texts}")
        if isinstance(req.input, RerankInput) and len(req.input.query) > ep.max_text_chars:
            return refuse("invalid", "text_too_long",
                          f"input.query has {len(req.input.query)} characters, the limit is "
                          f"max_text_chars = {ep.max_text_chars}")
        for i, text in enumerate(texts):
            if len(text) > ep.max_text_chars:
                return refuse("invalid", "text_too_long",
                              f"{field}[{i}] has {len(text)} characters, the limit is "
                              f"max_text_chars = {ep.max_text_chars}")
        if len(raw) > config.service.max_message_bytes:
            return refuse("invalid", "message_too_large",
                          f"message is {len(raw)} bytes, the limit is "
                          f"service.max_message_bytes = {config.service.max_message_bytes}")

        counter = token_counter[req.endpoint] if isinstance(token_counter, Mapping) \
            else token_counter
        costed = resolve_input(req.input, req.endpoint, ep, counter)
        if isinstance(costed, OptionRefusal):
            return refuse("invalid", costed.reason, costed.message, tokens=costed.tokens)
        tokens = costed.tokens
        if tokens > ep.max_request_tokens:
            return refuse("invalid", "too_many_tokens",
                          f"request has {tokens} tokens, the limit of endpoint {req.endpoint!r} "
                          f"is max_request_tokens = {ep.max_request_tokens}", tokens=tokens)

        created_ms = req.created_ms
        if created_ms is None:
            # The record timestamp is the sender's too (CreateTime): any int64.
            created_ms = record_timestamp_ms \
                if record_timestamp_ms and 0 < record_timestamp_ms <= _EPOCH_MS_MAX else now_ms
        # Clamped, not refused: a deadline past year 5138 is no deadline, and an
        # out-of-range value would make the scheduler dead-letter an admitted request.
        deadline_at_ms = min(created_ms + req.deadline_ms, _EPOCH_MS_MAX) \
            if req.deadline_ms is not None else None
        if deadline_at_ms is not None and deadline_at_ms <= now_ms:
            return refuse("expired", "deadline_passed",
                          f"deadline_ms = {req.deadline_ms} from created_ms = {created_ms} passed "
                          f"{now_ms - deadline_at_ms} ms before admission", tokens=tokens)

        limit = limiter.check(req.org, req.endpoint, tokens, now_ms)
        if not limit.allowed:
            what = f"{limit.limit} {limit.unit} per {limit.window_s:g} s"
            if limit.never:
                message = (f"request of {tokens} tokens can never fit the rate limit of {what} "
                           f"for org {req.org!r} on endpoint {req.endpoint!r}")
            else:
                message = (f"rate limit of {what} for org {req.org!r} on endpoint "
                           f"{req.endpoint!r} reached; retry after {limit.retry_after_ms} ms")
            return refuse("rejected", "rate_limited", message, limit.retry_after_ms, tokens)
        overload = throttle_state.check_overload(config)
        if overload is not None:
            return refuse("rejected", overload.reason, overload.message, overload.retry_after_ms,
                          tokens)
        throttle = throttle_state.check_throttle(
            config, endpoint=req.endpoint, tier=org.tier, org=req.org, tokens=tokens,
            now_ms=now_ms, deadline_at_ms=deadline_at_ms,
            # Only a created_ms the sender stamped (the client library does): a
            # record timestamp may come from any clock, or none.
            waited_ms=now_ms - req.created_ms if req.created_ms is not None else 0.0,
        )
        if throttle is not None:
            return refuse("rejected", throttle.reason, throttle.message, throttle.retry_after_ms,
                          tokens)

        limiter.acquire(req.org, req.endpoint, tokens, now_ms)
        throttle_state.note_admitted(endpoint=req.endpoint, tier=org.tier, org=req.org,
                                     tokens=tokens, at_ms=now_ms)
        return Admitted(
            request=AdmittedRequest(
                id=req.id, org=req.org, endpoint=req.endpoint, tier=org.tier, input=costed.input,
                tokens=tokens, priority=req.priority, deadline_at_ms=deadline_at_ms,
                created_ms=created_ms, admitted_ms=now_ms, reply_to=reply_to, reply_format=fmt,
                # Packs only on a reply topic of the sender's own: readers of the shared
                # results topic read one result per record, as documented.
                reply_packed=req.reply_packed and reply_to != topics.results,
            ),
            topic=topics.tier(org.tier),
        )


def decide(
    record_value: bytes | None,
    headers: Any,
    record_timestamp_ms: int | None,
    config: Config,
    limiter: RateLimiter,
    throttle_state: ThrottleState,
    token_counter: TokenCounter | Mapping[str, TokenCounter],
    now_ms: int,
) -> Outcome:
    """One decision: :meth:`Admission.decide` with this state (tests, one-off checks).

    ``token_counter`` is one counter for every endpoint, or one per endpoint name.
    """
    return Admission(limiter, throttle_state, token_counter).decide(
        record_value, headers, record_timestamp_ms, config, now_ms)


def _salvage(data: bytes | None, fmt: Format, reason: str, error: str,
             config: Config) -> DeadLetterReason:
    """A dead letter, plus an ``invalid`` result when the record's id is readable."""
    fields = _lenient_fields(data, fmt)
    request_id = fields.get("id")
    try:
        request_id = msgspec.convert(request_id, RequestId)
    except msgspec.ValidationError:
        return DeadLetterReason(reason=reason, error=error)
    org = fields.get("org")
    endpoint = fields.get("endpoint")
    return DeadLetterReason(
        reason=reason,
        error=error,
        result=Result(
            id=request_id, status="invalid",
            org=org if isinstance(org, str) else "",
            endpoint=endpoint if isinstance(endpoint, str) else "",
            reason="decode_error",
            message=f"the request could not be decoded: {error}",
        ),
        reply_to=reply_topic_for(fields.get("reply_to"), config),
        reply_format=fmt,
    )


def _lenient_fields(data: bytes | None, fmt: Format) -> dict[str, Any]:
    """The top-level object of ``data`` with no schema, or {} when there is none."""
    if not data:
        return {}
    try:
        obj = msgspec.json.decode(data) if fmt == "json" else msgspec.msgpack.decode(data)
    except Exception:  # noqa: BLE001 - any failure means nothing can be salvaged
        return {}
    return obj if isinstance(obj, dict) else {}
