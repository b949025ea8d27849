"""Hostile input for the fuzz tests: raw bytes, hostile field values, and the
requests they are spliced into, each with the outcome the trust rules demand.

Bodies are assembled from encoded pieces (``Value``: one field value as raw
JSON bytes and as raw msgpack bytes), not from Python objects, so that what no
well-behaved encoder writes can be written here: ``NaN`` and ``1e400``
literals, invalid UTF-8 inside a string, duplicate keys, a msgpack array that
declares four billion elements, ten thousand levels of nesting.

A :class:`Case` carries the bytes, the headers, the record timestamp and an
:class:`Expect`: what :func:`producer.admission.decide` must answer. The
expectation is worked out here, by hand, from the documented order of checks
(``producer/admission.py``) and the schema (``schemas/messages.py``), never by
asking the code under test.

Also here: :func:`fuzz_cases`, the number of examples per fuzz property (10,000;
ten times that under the ``long`` hypothesis profile), and the allowed-reply
oracle :func:`allowed_reply_topic`.
"""

from __future__ import annotations

import functools
import os
import random
import re
import string
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from schemas.topics import Topics
from tests.admission_setup import NOW_MS, make_config

__all__ = [
    "CONFIG",
    "NOW_MS",
    "REPLY_PREFIX",
    "RESULTS",
    "BurstRecord",
    "Case",
    "Expect",
    "Raw",
    "Value",
    "allowed_reply_topic",
    "bombs",
    "damage",
    "deep_nesting",
    "format_headers",
    "fuzz_cases",
    "fuzz_settings",
    "headers_from",
    "hostile_burst",
    "hostile_bytes",
    "hostile_headers",
    "hostile_headers_from",
    "json_from_seed",
    "json_like",
    "mutated_case",
    "random_value",
    "raw_from_seed",
    "record_timestamps",
    "valid_case",
    "valid_request_id",
]

# -- how many cases ----------------------------------------------------------------


def fuzz_cases(base: int | None = None) -> int:
    """Examples per fuzz property: ``base`` (default 10,000, or ``SF_FUZZ_CASES``)
    times the profile's scale (1 for ``dev``/``ci``, 10 for ``long``)."""
    if base is None:
        base = int(os.environ.get("SF_FUZZ_CASES", "10000"))
    scale = max(1, settings().max_examples // 500)  # dev/ci: 200 -> 1; long: 5,000 -> 10
    return base * scale


def fuzz_settings(base: int | None = None) -> settings:
    """Settings of one fuzz property: :func:`fuzz_cases` examples, large inputs allowed."""
    return settings(
        max_examples=fuzz_cases(base),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )


# -- the registry under attack ------------------------------------------------------------

#: tests/admission_setup.py's registry: tiers enterprise > standard > free; embed caps
#: 9/5/2, rerank no caps (0); max_texts 4, max_text_chars 50, max_request_tokens 20,
#: max_message_bytes 2000.
CONFIG = make_config()
TOPICS = Topics.of(CONFIG)
RESULTS = TOPICS.results
REPLY_PREFIX = TOPICS.reply_prefix(CONFIG)

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._\-]{1,249}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_NAME64 = re.compile(r"[A-Za-z0-9._\-]{1,64}")


def allowed_reply_topic(name: object) -> bool:
    """The trust rule for where a result may go: the shared results topic, or a
    legal Kafka topic name strictly under ``<topic_prefix><reply_prefix>``."""
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name):
        return False
    return name == RESULTS or (name.startswith(REPLY_PREFIX) and len(name) > len(REPLY_PREFIX))


def valid_request_id(value: object) -> bool:
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def _valid_name(value: object) -> bool:
    return isinstance(value, str) and _NAME64.fullmatch(value) is not None


# -- encoded pieces ----------------------------------------------------------------


class Value(NamedTuple):
    """One value as raw JSON and raw msgpack bytes (None: not expressible there)."""

    json: bytes | None
    mp: bytes | None


def both(obj: Any) -> Value:
    """``obj`` encoded both ways (ints beyond msgpack's 64 bits: JSON only)."""
    try:
        mp = msgspec.msgpack.encode(obj)
    except OverflowError:
        mp = None
    return Value(msgspec.json.encode(obj), mp)


def _mp_map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 1 << 16:
        return b"\xde" + struct.pack(">H", n)
    return b"\xdf" + struct.pack(">I", n)


def _mp_str_header(n: int) -> bytes:
    if n < 32:
        return bytes([0xA0 | n])
    if n < 1 << 8:
        return b"\xd9" + bytes([n])
    if n < 1 << 16:
        return b"\xda" + struct.pack(">H", n)
    return b"\xdb" + struct.pack(">I", n)


def raw_str(data: bytes) -> Value:
    """A string whose bytes are ``data`` verbatim (invalid UTF-8 included)."""
    return Value(b'"' + data + b'"', _mp_str_header(len(data)) + data)


def body(fields: list[tuple[str, Value]], fmt: str) -> bytes | None:
    """A JSON object or msgpack map of the fields in order (duplicate keys kept);
    None when a value has no encoding in ``fmt``."""
    if fmt == "json":
        parts = []
        for key, v in fields:
            if v.json is None:
                return None
            parts.append(msgspec.json.encode(key) + b":" + v.json)
        return b"{" + b",".join(parts) + b"}"
    out = [_mp_map_header(len(fields))]
    for key, v in fields:
        if v.mp is None:
            return None
        out.append(msgspec.msgpack.encode(key) + v.mp)
    return b"".join(out)


# -- expectations ----------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What decide() must answer.

    ``kind``: ``admitted``, ``refused`` (with ``status`` and ``reason``) or
    ``dead`` (reason in ``reasons``; ``result``: True when an ``invalid`` result
    must come with it, False when none may, None when either is right).
    ``reply_to``: where the salvaged result must go, when there is one.
    """

    kind: str
    status: str | None = None
    reason: str | None = None
    reasons: frozenset[str] = frozenset()
    result: bool | None = None
    reply_to: str | None = None


ADMIT = Expect("admitted")


def refuse(reason: str, status: str = "invalid") -> Expect:
    return Expect("refused", status=status, reason=reason)


def dead(*reasons: str, result: bool | None = None, reply_to: str | None = None) -> Expect:
    return Expect("dead", reasons=frozenset(reasons), result=result, reply_to=reply_to)


#: Dead-letter reasons of a record that fails the schema (msgspec: ValidationError) and
#: of one that is not the encoding at all (DecodeError, recursion, bad UTF-8).
SCHEMA = "invalid"
MALFORMED = "malformed"
#: Fails the schema, and no generic parser can read the record either (1e400, an
#: integer past Python's 4,300-digit limit): a dead letter, with no id to answer.
UNSALVAGEABLE = "unsalvageable"
BAD_LITERAL = "bad-literal"


@dataclass(frozen=True)
class Case:
    """One ingress record and what admission must make of it."""

    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp_ms: int | None
    expect: Expect
    label: str
    fmt: str = "json"
    #: The request's fields as sent (None when the body is not a request at all).
    fields: list[tuple[str, Value]] | None = field(default=None, compare=False)


# -- headers ----------------------------------------------------------------

_JSON_TYPES = [b"application/json", b"APPLICATION/JSON", b"json",
               b"application/json; charset=utf-8", b"  application/json  "]
_MSGPACK_TYPES = [b"application/msgpack", b"application/x-msgpack", b"msgpack",
                  b"Application/MsgPack;v=1"]
_CT_KEYS = ["content-type", "Content-Type", "CONTENT-TYPE"]
_BAD_TYPES = [b"", b"text/xml", b"application/json5", b"application/cbor", b"text/plain",
              b"application/msgpack\x00", b"json\xff", b"\xe2\x80\x8bjson", b"application/\xc3\xa9",
              b"\xff\xfe\x00\x00", b";", b"application/json,application/msgpack"]
_OTHER_KEYS = ["x-trace-id", "content-type ", "contenttype", "traceparent", "\u00e9t\u00e9",
               "content_type"]


@functools.cache
def _other_header() -> st.SearchStrategy[tuple[str, bytes | None]]:
    key = st.sampled_from(_OTHER_KEYS) | st.text(max_size=12).filter(
        lambda k: k.lower() != "content-type")
    return st.tuples(key, st.none() | st.binary(max_size=24))


@functools.cache
def format_headers(fmt: str) -> st.SearchStrategy[list[tuple[str, bytes | None]] | None]:
    """Headers that announce ``fmt`` (JSON also by having no content-type), with
    unrelated headers, non-ASCII bytes included, around them."""
    types = _JSON_TYPES if fmt == "json" else _MSGPACK_TYPES
    announce = st.tuples(st.sampled_from(_CT_KEYS), st.sampled_from(types))
    with_ct = st.tuples(st.lists(_other_header(), max_size=2), announce,
                        st.lists(_other_header(), max_size=2)).map(
        lambda t: [*t[0], t[1], *t[2]])
    if fmt == "msgpack":
        return with_ct
    bare = st.none() | st.lists(_other_header(), max_size=3)
    return bare | with_ct


@functools.cache
def bad_content_type_headers() -> st.SearchStrategy[list[tuple[str, bytes | None]]]:
    """Headers whose first content-type is unsupported or not ASCII."""
    bad = st.sampled_from(_BAD_TYPES) | st.binary(max_size=16).filter(
        lambda b: b.decode("latin-1").split(";")[0].strip().lower()
        not in {"application/json", "json", "application/msgpack", "application/x-msgpack",
                "msgpack"})
    return st.tuples(st.lists(_other_header(), max_size=2), st.sampled_from(_CT_KEYS), bad).map(
        lambda t: [*t[0], (t[1], t[2])])


@functools.cache
def hostile_headers() -> st.SearchStrategy[Any]:
    """Any headers at all: none, junk, None values, several content-types, non-ASCII."""
    return _SEEDS.map(lambda seed: hostile_headers_from(random.Random(seed)))


@functools.cache
def record_timestamps() -> st.SearchStrategy[int | None]:
    """Kafka record timestamps: the sender sets CreateTime, so anything in int64."""
    return st.sampled_from([None, NOW_MS - 5, 0, -1, 10**14, 10**14 + 1, 2**63 - 1, -(2**63)]) \
        | st.integers(-(2**63), 2**63 - 1)


# -- valid requests ----------------------------------------------------------------

_ID_CHARS = string.ascii_letters + string.digits + "._:-"
_TOPIC_CHARS = string.ascii_letters + string.digits + "._-"
#: Characters of the texts of valid requests: ASCII, JSON's escapes, accents,
#: CJK, combining marks, right-to-left, emoji, a zero-width joiner (no whitespace:
#: words are joined by spaces, so their count is their token count).
_TEXT_CHARS = (string.ascii_letters + string.digits + "\"\\/{}[]:,.'<>&%$#@!?"
               + "\u00e9\u00df\u00f1\u4e2d\u6587\u0301\u05d0\u0627\u200d\U0001f600\U0001f9ea")
#: Orgs whose fresh rate limits admit one request on each endpoint (the free tier's
#: rerank window is 0 requests: closed).
_EMBED_ORGS = sorted(CONFIG.orgs)
_RERANK_ORGS = sorted(o for o, org in CONFIG.orgs.items() if org.tier != "free")


def _words(rng: random.Random, most: int) -> str:
    return " ".join("".join(rng.choices(_TEXT_CHARS, k=rng.randint(1, 5)))
                    for _ in range(rng.randint(0, most)))


def _rng_headers(rng: random.Random, fmt: str) -> list[tuple[str, bytes | None]] | None:
    """Headers announcing ``fmt`` (JSON also by having none), among unrelated ones."""
    others = [(rng.choice(_OTHER_KEYS), rng.choice([None, b"", b"1", b"\xff\xfe", b"abc"]))
              for _ in range(rng.randint(0, 2))]
    if fmt == "json" and rng.random() < 0.5:
        return others or rng.choice([None, []])
    types = _JSON_TYPES if fmt == "json" else _MSGPACK_TYPES
    at = rng.randint(0, len(others))
    return [*others[:at], (rng.choice(_CT_KEYS), rng.choice(types)), *others[at:]]


#: One draw per request: the request is built from a seed, which keeps a case at a
#: few draws (hypothesis spends ~0.1 ms per draw; a drawn request took ~80).
_SEEDS = st.integers(0, 2**64 - 1)


@dataclass(frozen=True)
class Base:
    """A request that admission must admit (with fresh limits), as ordered fields."""

    fields: list[tuple[str, Value]]
    org: str
    endpoint: str
    cap: int
    fmt: str
    headers: list[tuple[str, bytes | None]] | None
    reply_to: str | None

    def with_field(self, key: str, value: Value) -> list[tuple[str, Value]]:
        """Fields with ``key`` replaced (or added at the end)."""
        out = [(k, value if k == key else v) for k, v in self.fields]
        return out if any(k == key for k, _ in out) else [*out, (key, value)]

    def without(self, key: str) -> list[tuple[str, Value]]:
        return [(k, v) for k, v in self.fields if k != key]


def base_from_seed(seed: int) -> Base:
    """A request within every rule: registry org, its endpoint, priority within the
    cap, at most 4 short texts and 20 tokens, a live deadline, an allowed reply topic,
    maybe unknown fields (which must be skipped) and nulls (which mean absent), in
    any order, as JSON or msgpack."""
    rng = random.Random(seed)
    endpoint = rng.choice(["embed", "rerank"])
    org = rng.choice(_EMBED_ORGS if endpoint == "embed" else _RERANK_ORGS)
    cap = CONFIG.priority_cap(CONFIG.orgs[org].tier, endpoint)
    if endpoint == "embed":
        inp: dict[str, Any] = {"type": "embed",
                               "texts": [_words(rng, 4) for _ in range(rng.randint(1, 4))]}
    else:
        inp = {"type": "rerank", "query": _words(rng, 2),
               "documents": [_words(rng, 2) for _ in range(rng.randint(1, 4))]}
        if rng.random() < 0.5:
            inp["top_n"] = rng.choice([1, 2, 10, 2**63 - 1])
    size = rng.choice([1, 2, 8, 36, 128])
    fields: list[tuple[str, Any]] = [
        ("id", "".join(rng.choices(_ID_CHARS, k=rng.randint(1, size)))),
        ("org", org),
        ("endpoint", endpoint),
        ("input", inp),
    ]
    if rng.random() < 0.5:
        fields.append(("priority", rng.randint(0, cap)))
    if rng.random() < 0.5:
        fields.append(("deadline_ms", rng.choice([10_000, 86_400_000,
                                                  rng.randint(10_000, 86_400_000)])))
        if rng.random() < 0.5:
            fields.append(("created_ms", NOW_MS + rng.randint(-5_000, 5_000)))
    reply_to = rng.choice([None, RESULTS, REPLY_PREFIX + "".join(
        rng.choices(_TOPIC_CHARS, k=rng.choice([1, 12, 100])))])
    if reply_to is not None:
        fields.append(("reply_to", reply_to))
    for key in rng.sample(["trace", "v", "x-extra", "meta"], rng.randint(0, 2)):
        fields.append((key, rng.choice([None, -5, 3, "", "abc", [True, False], {"k": [1]}])))
    for key in rng.sample(["tier", "weight", "deadline_ms", "created_ms"], rng.randint(0, 2)):
        if key not in dict(fields):
            fields.append((key, None))
    rng.shuffle(fields)
    fmt = rng.choice(["json", "msgpack"])
    return Base(fields=[(k, both(v)) for k, v in fields], org=org, endpoint=endpoint, cap=cap,
                fmt=fmt, headers=_rng_headers(rng, fmt), reply_to=reply_to)


@functools.cache
def valid_base() -> st.SearchStrategy[Base]:
    return _SEEDS.map(base_from_seed)


@functools.cache
def valid_case() -> st.SearchStrategy[Case]:
    """A valid request, to be admitted."""
    return valid_base().map(lambda b: Case(body(b.fields, b.fmt), b.headers, NOW_MS - 5, ADMIT,
                                           "valid", b.fmt, b.fields))


#: msgpack headers that declare far more than follows: arrays, maps, strings, binaries
#: and extensions of up to four billion elements or bytes.
BOMBS = [
    b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
    b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff", b"\xde\xff\xff",
    b"\xda\xff\xff", b"\xc5\xff\xff", b"\xdd\x7f\xff\xff\xff\xc0",
    b"\x9f" + b"\xdd\xff\xff\xff\xff" * 15,
    b"\xdf\x00\x01\x00\x00" + b"\xa1k\xdd\xff\xff\xff\xff",
]


# -- hostile field values ------------------------------------------------------------

#: Strings that must never pass as an id, org, endpoint or topic: empty, blank,
#: path-like, control characters, look-alike and invisible unicode, too long.
EVIL_STRINGS = [
    "", " ", "\t", "..", ".", "../x", "a/b", "a\\b", "/etc/passwd", "a b", "a\nb", "a\x00b",
    "\x00", "%00", "${jndi:x}", "'; drop table orgs;--", "<script>", "acme\u200b",
    "\u0430cme", "\uff41\uff43\uff4d\uff45", "\u202eemca", "\U0001f600", "e\u0301",
    "a" * 65, "a" * 129, "a" * 250, "a" * 10_000,
]


def _evil_string_at(i: int) -> str:
    return EVIL_STRINGS[i]


@functools.cache
def evil_string() -> st.SearchStrategy[str]:
    # By index: the strategy's repr (in statistics and reports) stays short.
    evil = st.integers(0, len(EVIL_STRINGS) - 1).map(_evil_string_at)
    return evil | st.text(max_size=40) | st.text(
        alphabet=st.characters(min_codepoint=0x80, exclude_categories=("Cs",)), min_size=1,
        max_size=8)


@functools.cache
def not_a_string() -> st.SearchStrategy[Value]:
    """A value of the wrong type where a string belongs."""
    return st.sampled_from([0, -1, 1.5, True, None, [], {}, ["a"], {"a": "b"}]).map(both) \
        | st.binary(max_size=8).map(lambda b: Value(None, msgspec.msgpack.encode(b)))


class Num(NamedTuple):
    """A hostile number: its bytes, and what it is to a decoder (int, float, or not a
    number; ``None`` value for the literals no decoder accepts)."""

    value: Value
    #: "int" | "float" | "json-malformed" | "json-out-of-range" | "json-int-huge" | "other"
    kind: str
    number: float | int | None


def _int(n: int) -> Num:
    return Num(both(n), "int", n)


def _float(x: float) -> Num:
    return Num(both(x), "float", x)


HOSTILE_NUMBERS: list[Num] = [
    _int(-1), _int(0), _int(-(2**63)), _int(2**63 - 1), _int(2**64 - 1), _int(2**70),
    _int(-(2**70)), _int(10**14 + 1), _int(86_400_001), _int(101),
    Num(Value(b"9" * 5_000, None), "json-int-huge", None),
    _float(1.5), _float(-0.5), _float(1e308), _float(5e-324), _float(-1e308),
    Num(Value(b"1e400", msgspec.msgpack.encode(float("inf"))), "json-out-of-range", None),
    Num(Value(b"-1e400", msgspec.msgpack.encode(float("-inf"))), "json-out-of-range", None),
    Num(Value(b"NaN", msgspec.msgpack.encode(float("nan"))), "json-malformed", None),
    Num(Value(b"Infinity", msgspec.msgpack.encode(float("inf"))), "json-malformed", None),
    Num(Value(b"-Infinity", msgspec.msgpack.encode(float("-inf"))), "json-malformed", None),
    Num(Value(b"0x10", None), "json-malformed", None),
    Num(Value(b"01", None), "json-malformed", None),
    Num(Value(b"+1", None), "json-malformed", None),
    Num(both(True), "other", None), Num(both("1"), "other", None), Num(both([1]), "other", None),
    Num(both({"n": 1}), "other", None),
]


@functools.cache
def hostile_number() -> st.SearchStrategy[Num]:
    return st.sampled_from(HOSTILE_NUMBERS) | st.integers(-(2**64), 2**64).map(_int) | st.floats(
        allow_nan=False, allow_infinity=False).map(_float)


def _int_field(num: Num, fmt: str, lo: int, hi: int | None) -> str:
    """How an int field with bounds [lo, hi] takes ``num``: ``ok``, or the dead-letter reason."""
    if (num.value.json is None and fmt == "json") or (num.value.mp is None and fmt == "msgpack"):
        return "unencodable"
    if fmt == "json" and num.kind == "json-malformed":
        return BAD_LITERAL
    if fmt == "json" and num.kind in ("json-int-huge", "json-out-of-range"):
        return UNSALVAGEABLE
    if num.kind != "int":
        return SCHEMA
    n = num.number
    if n < lo or (hi is not None and n > hi):
        return SCHEMA
    return "ok"


_FLOAT_MAX = 1.7976931348623157e308


def _float_field(num: Num, fmt: str) -> str:
    """How ``weight`` (float | None) takes ``num``: ``ok`` (a claimed weight) or the reason."""
    if (num.value.json is None and fmt == "json") or (num.value.mp is None and fmt == "msgpack"):
        return "unencodable"
    if fmt == "json" and num.kind == "json-malformed":
        return BAD_LITERAL
    if fmt == "json" and num.kind in ("json-int-huge", "json-out-of-range"):
        return UNSALVAGEABLE
    if num.kind == "int" and fmt == "json" and abs(num.number) > _FLOAT_MAX:
        return SCHEMA  # no float holds it: msgspec says "out of range"
    if fmt == "msgpack" and num.kind in ("json-malformed", "json-out-of-range"):
        return "ok"  # in msgpack these are the floats NaN and +-inf: a claimed weight
    return "ok" if num.kind in ("int", "float") else SCHEMA


# -- one mutated field -----------------------------------------------------------------


def _salvage_reply(fields: list[tuple[str, Value]], fmt: str) -> str:
    """Where a salvaged result must go: the sent reply_to when allowed, else results."""
    sent = None
    for k, v in fields:  # the last occurrence wins, as in every decoder here
        if k == "reply_to":
            raw = v.json if fmt == "json" else v.mp
            try:
                sent = (msgspec.json.decode(raw) if fmt == "json"
                        else msgspec.msgpack.decode(raw))
            except (msgspec.DecodeError, RecursionError, ValueError):
                sent = None
    return sent if allowed_reply_topic(sent) else RESULTS


def _schema_dead(fields: list[tuple[str, Value]], fmt: str) -> Expect:
    """A body that parses but fails the schema, with a readable id: dead letter + result."""
    return dead(SCHEMA, result=True, reply_to=_salvage_reply(fields, fmt))


def _field_dead(reason: str, fields: list[tuple[str, Value]], fmt: str) -> Expect:
    if reason == SCHEMA:
        return _schema_dead(fields, fmt)
    if reason == UNSALVAGEABLE:
        return dead(SCHEMA, result=False)
    if reason == BAD_LITERAL:
        # Not JSON (NaN, 0x10, 01): msgspec may stop at the bad character
        # ("malformed") or first check the number read so far ("invalid").
        return dead(SCHEMA, MALFORMED, result=False)
    return dead(reason, result=False)


_UNKNOWN_ORG = st.text(_TOPIC_CHARS, min_size=1, max_size=64).filter(
    lambda o: o not in CONFIG.orgs)
_UNKNOWN_ENDPOINT = st.sampled_from(["generate", "EMBED", "embed.", "rerank-v2", ".."]) | st.text(
    _TOPIC_CHARS, min_size=1, max_size=64)
_EVIL_NAME = evil_string().filter(lambda s: not _valid_name(s))
_CLAIMED_TIER = st.sampled_from(CONFIG.tier_names) | evil_string()
_ABOVE_CAP = {cap: st.integers(cap + 1, 100) for cap in range(100)}
_SOME_HOSTILE_NUMBER = st.sampled_from(HOSTILE_NUMBERS)
_OUTSIDE_PREFIX = st.sampled_from([
    TOPICS.tier("enterprise"), TOPICS.batches("embed"), TOPICS.dead_letters,
    TOPICS.worker_events, TOPICS.scheduler_state, TOPICS.ingress, REPLY_PREFIX,
    REPLY_PREFIX.rstrip("."), REPLY_PREFIX.upper() + "x", "replies.x", "x" + REPLY_PREFIX,
    "sf.results2", "__consumer_offsets", "sf..replies.x",
]) | st.text(_TOPIC_CHARS, min_size=1, max_size=249).filter(lambda t: not allowed_reply_topic(t))
_ILLEGAL_REPLY = (st.sampled_from(["", REPLY_PREFIX + "../x", REPLY_PREFIX + "a/b",
                                   REPLY_PREFIX + "\u00fc", REPLY_PREFIX + "x y",
                                   REPLY_PREFIX + "x" * 239, REPLY_PREFIX + "x" * 10_000,
                                   REPLY_PREFIX + "\u200b", REPLY_PREFIX + "x\x00"])
                  | evil_string().map(REPLY_PREFIX.__add__)).filter(
    lambda t: not _TOPIC_NAME.fullmatch(t))
_MANY_TEXTS = st.integers(5, 40)
_LONG_LENGTH = st.sampled_from([51, 52, 1000, 100_000]) | st.integers(51, 3000)
_LONG_CHAR = st.sampled_from(["x", "\u00e9", "\U0001f600", " "])
_LONG_PLACES = st.sampled_from([0, 1, 2])
_PADDING = st.integers(2001, 50_000)
_MANY_WORDS = st.integers(21, 25)
_ANY_DEADLINE = st.integers(1, 86_400_000)
_LATE = st.integers(0, 10**9)
_BAD_ID = _EVIL_NAME.filter(lambda s: not valid_request_id(s)) | st.just(None)
_REQUIRED = st.sampled_from(["org", "endpoint", "input"])
_BAD_INPUT = st.sampled_from([
    {"type": "generate", "texts": ["a"]}, {"texts": ["a"]}, {"type": "embed", "texts": "a"},
    {"type": "embed"}, {"type": "embed", "texts": [1]}, {"type": None}, [], "embed",
    {"type": "rerank", "query": 1, "documents": ["d"]}, {"type": "rerank", "documents": ["d"]}])
_BAD_UTF8 = st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                             b"a\x80b", b"\xe2\x82", b"\xf4\x90\x80\x80"])
_UTF8_KEY = st.sampled_from(["id", "org", "reply_to", "trace"])


def _mutate(draw: st.DrawFn, base: Base, name: str) -> tuple[list[tuple[str, Value]] | None,
                                                               bytes | None, Expect]:
    """Apply mutation ``name``; return (fields, raw body or None, expectation)."""
    fmt = base.fmt
    if name == "unknown_org":
        org = draw(_UNKNOWN_ORG)
        return base.with_field("org", both(org)), None, refuse("unknown_org")
    if name == "evil_org":
        org = draw(evil_string())  # cached
        org = org if org not in CONFIG.orgs else org + "x"  # a registered name is not evil
        fields = base.with_field("org", both(org))
        if _valid_name(org):
            return fields, None, refuse("unknown_org")
        return fields, None, _schema_dead(fields, fmt)
    if name == "org_not_a_string":
        fields = base.with_field("org", draw(not_a_string()))
        return fields, None, _schema_dead(fields, fmt)
    if name == "unknown_endpoint":
        ep = draw(_UNKNOWN_ENDPOINT)
        ep = ep if ep not in CONFIG.endpoints else ep + "x"
        return base.with_field("endpoint", both(ep)), None, refuse("unknown_endpoint")
    if name == "evil_endpoint":
        ep = draw(_EVIL_NAME)
        fields = base.with_field("endpoint", both(ep))
        return fields, None, _schema_dead(fields, fmt)
    if name == "input_kind_mismatch":
        inp = {"type": "rerank", "query": "q", "documents": ["d"]} if base.endpoint == "embed" \
            else {"type": "embed", "texts": ["a"]}
        return base.with_field("input", both(inp)), None, refuse("input_kind_mismatch")
    if name == "claimed_tier":
        tier = draw(_CLAIMED_TIER)
        return base.with_field("tier", both(tier)), None, refuse("tier_not_allowed")
    if name == "claimed_weight":
        num = draw(hostile_number())
        fields = base.with_field("weight", num.value)
        how = _float_field(num, fmt)
        if how == "unencodable":
            fields = base.with_field("weight", both(2.0))
            return fields, None, refuse("weight_not_allowed")
        if how == "ok":
            return fields, None, refuse("weight_not_allowed")
        return fields, None, _field_dead(how, fields, fmt)
    if name == "priority_above_cap":
        p = draw(_ABOVE_CAP[base.cap])
        return base.with_field("priority", both(p)), None, refuse("priority_above_cap")
    if name in ("hostile_priority", "hostile_deadline", "hostile_created", "hostile_top_n"):
        key, lo, hi = {
            "hostile_priority": ("priority", 0, 100),
            "hostile_deadline": ("deadline_ms", 1, 86_400_000),
            "hostile_created": ("created_ms", 0, 10**14),
            "hostile_top_n": ("top_n", 1, 2**63 - 1),
        }[name]
        num = draw(_SOME_HOSTILE_NUMBER)
        how = _int_field(num, fmt, lo, hi)
        if how in ("ok", "unencodable"):
            num, how = _int(-1), SCHEMA  # below every lower bound here
        if key == "top_n":
            # Decoding fails at top_n, before any registry check: the endpoint is moot.
            inp = [(k, both(v)) for k, v in
                   {"type": "rerank", "query": "q", "documents": ["d"]}.items()]
            raw_inp = body([*inp, ("top_n", num.value)], fmt)
            value = Value(raw_inp, None) if fmt == "json" else Value(None, raw_inp)
            fields = base.with_field("input", value)
            return fields, None, _field_dead(how, fields, fmt)
        fields = base.with_field(key, num.value)
        return fields, None, _field_dead(how, fields, fmt)
    if name == "reply_outside_prefix":
        topic = draw(_OUTSIDE_PREFIX)
        return base.with_field("reply_to", both(topic)), None, refuse("reply_topic_not_allowed")
    if name == "evil_reply_to":
        topic = draw(_ILLEGAL_REPLY)
        fields = base.with_field("reply_to", both(topic))
        return fields, None, _schema_dead(fields, fmt)
    if name == "too_many_texts":
        n = draw(_MANY_TEXTS)
        key, inp = ("texts", {"type": "embed", "texts": ["a"] * n}) if base.endpoint == "embed" \
            else ("documents", {"type": "rerank", "query": "q", "documents": ["d"] * n})
        return base.with_field("input", both(inp)), None, refuse("too_many_texts")
    if name == "no_texts":
        inp = {"type": "embed", "texts": []} if base.endpoint == "embed" else \
            {"type": "rerank", "query": "q", "documents": []}
        fields = base.with_field("input", both(inp))
        return fields, None, _schema_dead(fields, fmt)
    if name == "text_too_long":
        long = draw(_LONG_CHAR) * draw(_LONG_LENGTH)
        if base.endpoint == "embed":
            inp = {"type": "embed", "texts": [[long], ["ok", long], [long, "ok"]][
                draw(_LONG_PLACES)]}
        elif draw(st.booleans()):
            inp = {"type": "rerank", "query": long, "documents": ["d"]}
        else:
            inp = {"type": "rerank", "query": "q", "documents": ["d", long]}
        return base.with_field("input", both(inp)), None, refuse("text_too_long")
    if name == "message_too_large":
        pad = draw(_PADDING)
        fields = [*base.fields, ("padding", both("p" * pad))]
        return fields, None, refuse("message_too_large")
    if name == "too_many_tokens":
        words = draw(_MANY_WORDS)
        text = " ".join(["w"] * words)
        inp = {"type": "embed", "texts": [text]} if base.endpoint == "embed" else \
            {"type": "rerank", "query": "q q", "documents": ["d " * 10] * 2}
        return base.with_field("input", both(inp)), None, refuse("too_many_tokens")
    if name == "deadline_passed":
        deadline = draw(_ANY_DEADLINE)
        late = draw(_LATE)
        fields = base.with_field("deadline_ms", both(deadline))
        fields = [(k, v) for k, v in fields if k != "created_ms"]
        fields.append(("created_ms", both(NOW_MS - deadline - late)))
        return fields, None, refuse("deadline_passed", status="expired")
    if name == "bad_id":
        rid = draw(_BAD_ID)
        fields = base.with_field("id", both(rid)) if rid is not None else base.without("id")
        return fields, None, dead(SCHEMA, result=False)
    if name == "id_not_a_string":
        fields = base.with_field("id", draw(not_a_string()))
        return fields, None, dead(SCHEMA, result=False)
    if name == "missing_field":
        key = draw(_REQUIRED)
        fields = base.without(key)
        return fields, None, _schema_dead(fields, fmt)
    if name == "bad_input_type":
        inp = draw(_BAD_INPUT)
        fields = base.with_field("input", both(inp))
        return fields, None, _schema_dead(fields, fmt)
    if name == "invalid_utf8":
        bad = draw(_BAD_UTF8)
        key = draw(_UTF8_KEY)
        fields = base.with_field(key, raw_str(bad))
        if key == "trace":
            # An unknown field is skipped unread (schema evolution): nothing of it
            # reaches the pipeline, so the request stands.
            return fields, None, ADMIT
        return fields, None, dead(MALFORMED, result=False)
    if name == "duplicate_key_first_hostile":
        # A hostile first occurrence, the base's value last. Every occurrence must
        # pass the schema; of those that do, the last one counts.
        present = [k for k, _ in base.fields if k in _DUPLICABLE]
        key = present[draw(st.integers(0, len(present) - 1))]
        value, schema_ok = draw(_DUPLICABLE_VALUES[key])
        fields = [(key, both(value)), *base.fields]
        return fields, None, ADMIT if schema_ok else _schema_dead(fields, fmt)
    if name == "duplicate_key_hostile_last":
        key, value, expect = draw(_HOSTILE_LAST)
        fields = [*base.fields, (key, both(value))]
        if expect is None:
            expect = _schema_dead(fields, fmt)
        return fields, None, expect
    raise AssertionError(name)


#: First occurrences of a duplicated key: (value, passes the schema).
_DUPLICABLE: dict[str, list[tuple[Any, bool]]] = {
    "org": [("nobody", True), ("acme", True), ("", False), (5, False)],
    "endpoint": [("nope", True), ("embed", True), ("a/b", False)],
    "tier": [("enterprise", True), (None, True), (1, False)],
    "weight": [(1000.0, True), (-1, True), ("heavy", False)],
    "priority": [(99, True), (0, True), (101, False), (-1, False)],
    "reply_to": [(TOPICS.tier("enterprise"), True), ("", False), ("a/b", False)],
    "deadline_ms": [(1, True), (0, False)],
    "created_ms": [(0, True), (-1, False)],
}
_DUPLICABLE_VALUES = {k: st.sampled_from(v) for k, v in _DUPLICABLE.items()}
_HOSTILE_LAST = st.sampled_from([
    ("org", "nobody", refuse("unknown_org")),
    ("tier", "enterprise", refuse("tier_not_allowed")),
    ("weight", 1000.0, refuse("weight_not_allowed")),
    ("priority", 101, None),
    ("reply_to", TOPICS.tier("enterprise"), refuse("reply_topic_not_allowed")),
])

MUTATIONS = [
    "unknown_org", "evil_org", "org_not_a_string", "unknown_endpoint", "evil_endpoint",
    "input_kind_mismatch", "claimed_tier", "claimed_weight", "priority_above_cap",
    "hostile_priority", "hostile_deadline", "hostile_created", "hostile_top_n",
    "reply_outside_prefix", "evil_reply_to", "too_many_texts", "no_texts", "text_too_long",
    "message_too_large", "too_many_tokens", "deadline_passed", "bad_id", "id_not_a_string",
    "missing_field", "bad_input_type", "invalid_utf8", "duplicate_key_first_hostile",
    "duplicate_key_hostile_last",
]
#: Mutations of the record around the body rather than of one field.
RECORD_MUTATIONS = ["bad_content_type", "format_mismatch", "deep_unknown_field",
                    "bomb_in_field", "truncated", "not_an_object", "none", "timestamp"]


_MUTATION_NAMES = st.sampled_from(MUTATIONS + RECORD_MUTATIONS)
_DEPTH = st.sampled_from([2_000, 10_000, 100_000]) | st.integers(2_000, 20_000)
_BOMB_KEY = st.sampled_from(["id", "org", "input", "reply_to", "trace"])
_SOME_BOMB = st.sampled_from(BOMBS)
_NOT_AN_OBJECT = st.sampled_from([[], "req", 1, None, True, 1.5, [{"id": "r-1"}]])


@st.composite
def mutated_case(draw: st.DrawFn) -> Case:
    """A valid request with exactly one thing wrong (or nothing: ``none``), and the
    answer that one thing must get."""
    base = draw(valid_base())
    name = draw(_MUTATION_NAMES)
    fmt, headers, ts = base.fmt, base.headers, NOW_MS - 5
    if name in MUTATIONS:
        fields, raw, expect = _mutate(draw, base, name)
        value = raw if raw is not None else body(fields, fmt)
        if value is None:  # not expressible in this format: use the other one
            fmt = "json" if fmt == "msgpack" else "msgpack"
            headers = draw(format_headers(fmt))
            value = body(fields, fmt)
            if expect.kind == "dead" and expect.result:
                expect = _schema_dead(fields, fmt)
        return Case(value, headers, ts, expect, name, fmt, fields)
    fields = base.fields
    if name == "none":
        return Case(body(fields, fmt), headers, ts, ADMIT, name, fmt, fields)
    if name == "timestamp":
        # Any record timestamp: without created_ms it dates the request, and must
        # never make admission emit an out-of-range created_ms or deadline.
        ts = draw(record_timestamps())
        fields = [(k, v) for k, v in fields if k != "created_ms"]
        deadline = msgspec.json.decode(dict(fields)["deadline_ms"].json) \
            if "deadline_ms" in dict(fields) else None
        expect = ADMIT
        if deadline is not None and ts is not None and 0 < ts <= 10**14 \
                and ts + deadline <= NOW_MS:
            expect = refuse("deadline_passed", status="expired")
        return Case(body(fields, fmt), headers, ts, expect, name, fmt, fields)
    if name == "bad_content_type":
        value = body(fields, fmt)
        expect = dead("bad_content_type", result=(fmt == "json"),
                      reply_to=_salvage_reply(fields, "json") if fmt == "json" else None)
        return Case(value, draw(bad_content_type_headers()), ts, expect, name, fmt, fields)
    if name == "format_mismatch":
        other = "json" if fmt == "msgpack" else "msgpack"
        # JSON read as msgpack is a number (b"{" is fixint 123); msgpack read as JSON
        # is not JSON at all. Neither leaves a readable id.
        return Case(body(fields, fmt), draw(format_headers(other)), ts,
                    dead(SCHEMA, MALFORMED, result=False), name, other, fields)
    if name == "deep_unknown_field":
        depth = draw(_DEPTH)
        fields = [*fields, ("nested", deep_value(depth, draw(st.booleans())))]
        return Case(body(fields, fmt), headers, ts, dead(MALFORMED, result=False), name, fmt,
                    fields)
    if name == "bomb_in_field":
        key = draw(_BOMB_KEY)
        fields = base.with_field(key, Value(None, draw(_SOME_BOMB)))
        return Case(body(fields, "msgpack"), draw(format_headers("msgpack")), ts,
                    dead(SCHEMA, MALFORMED, result=False), name, "msgpack", fields)
    if name == "truncated":
        value = body(fields, fmt)
        cut = draw(st.integers(0, len(value) - 1))
        return Case(value[:cut], headers, ts, dead(SCHEMA, MALFORMED, "empty", result=False),
                    name, fmt, fields)
    if name == "not_an_object":
        obj = draw(_NOT_AN_OBJECT)
        value = msgspec.json.encode(obj) if fmt == "json" else msgspec.msgpack.encode(obj)
        return Case(value, headers, ts, dead(SCHEMA, result=False), name, fmt, None)
    raise AssertionError(name)


# -- raw hostile bytes -----------------------------------------------------------------

@functools.cache
def bombs() -> st.SearchStrategy[bytes]:
    return st.sampled_from(BOMBS) | st.tuples(
        st.sampled_from([b"\xdd", b"\xdf", b"\xdb", b"\xc6"]), st.integers(1 << 20, 2**32 - 1),
        st.binary(max_size=16)).map(lambda t: t[0] + struct.pack(">I", t[1]) + t[2])


def deep_value(depth: int, objects: bool) -> Value:
    """``depth`` nested arrays (or single-key objects), in both encodings."""
    if objects:
        return Value(b'{"k":' * depth + b"0" + b"}" * depth, b"\x81\xa1k" * depth + b"\x00")
    return Value(b"[" * depth + b"]" * depth, b"\x91" * depth + b"\x90")


@functools.cache
def deep_nesting() -> st.SearchStrategy[bytes]:
    """Whole records nested 1 to 200,000 levels deep, JSON or msgpack."""
    return st.tuples(st.sampled_from([10_000, 100_000, 200_000]) | st.integers(1, 20_000),
                     st.booleans(), st.booleans()).map(
        lambda t: deep_value(t[0], t[1])[0 if t[2] else 1])


_REQUEST_KEYS = ["id", "org", "endpoint", "input", "type", "texts", "query", "documents",
                 "top_n", "priority", "deadline_ms", "created_ms", "reply_to", "tier", "weight"]
_SCALARS: list[Any] = [
    None, True, False, 0, -1, 1, 101, 2**63 - 1, -(2**63), 2**64 - 1, 10**14 + 1, 1.5, -0.0,
    1e308, 5e-324, "", "embed", "rerank", "acme", "trial", "enterprise", "sf.replies.x",
    "sf.requests.enterprise", *EVIL_STRINGS[:24],
]
_JSON_ONLY: list[Any] = [2**70, -(2**70), 10**300]
_MSGPACK_ONLY: list[Any] = [float("nan"), float("inf"), float("-inf"), b"", b"\xff\x00bytes"]


def random_value(rng: random.Random, msgpack: bool, depth: int = 0,
                 keys: tuple[str, ...] = tuple(_REQUEST_KEYS)) -> Any:
    """A hostile value: nested lists and objects (keys mostly from ``keys``) with
    extreme numbers, evil strings and, in msgpack, NaN, infinities and bytes."""
    roll = rng.random()
    if depth < 4 and roll < 0.2:
        return [random_value(rng, msgpack, depth + 1, keys) for _ in range(rng.randint(0, 4))]
    if depth < 4 and roll < 0.45:
        return {(rng.choice(keys) if rng.random() < 0.8 else
                 "".join(rng.choices(_TEXT_CHARS, k=rng.randint(0, 6)))):
                random_value(rng, msgpack, depth + 1, keys) for _ in range(rng.randint(0, 6))}
    if roll < 0.55:
        return rng.choice(_MSGPACK_ONLY if msgpack else _JSON_ONLY)
    if roll < 0.65:
        return rng.randint(-(2**63), 2**63 - 1) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
    if roll < 0.75:
        return "".join(rng.choices(_TEXT_CHARS, k=rng.randint(0, 20)))
    return rng.choice(_SCALARS)


def json_from_seed(seed: int, msgpack: bool,
                   keys: tuple[str, ...] = tuple(_REQUEST_KEYS)) -> bytes:
    """A message-shaped value (object keys mostly from ``keys``), encoded."""
    rng = random.Random(seed)
    obj = random_value(rng, msgpack, 0, keys) if rng.random() < 0.3 else {
        rng.choice(keys): random_value(rng, msgpack, 1, keys) for _ in range(rng.randint(0, 8))}
    return msgspec.msgpack.encode(obj) if msgpack else msgspec.json.encode(obj)


@functools.cache
def json_like(msgpack: bool, keys: tuple[str, ...] = tuple(_REQUEST_KEYS)
              ) -> st.SearchStrategy[bytes]:
    """Encoded message-shaped values with hostile leaves (one draw each)."""
    return _SEEDS.map(lambda seed: json_from_seed(seed, msgpack, keys))


def damage(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: flip bits, drop, insert, duplicate, or truncate."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            break
        op = rng.choice(["flip", "drop", "insert", "dup", "cut", "byte"])
        i = rng.randrange(len(buf))
        if op == "flip":
            buf[i] ^= 1 << rng.randrange(8)
        elif op == "drop":
            del buf[i]
        elif op == "insert":
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == "dup":
            buf[i:i] = buf[i:rng.randint(i, min(len(buf), i + 16))]
        elif op == "cut":
            del buf[i:]
        else:
            buf[i] = rng.choice([0x00, 0x22, 0x5C, 0x7B, 0x7D, 0x80, 0xC0, 0xDD, 0xFF])
    return bytes(buf)


def _damaged_request(seed: int) -> bytes:
    b = base_from_seed(seed)
    return damage(body(b.fields, b.fmt), random.Random(seed + 1))


def hostile_headers_from(rng: random.Random) -> list[tuple[str, bytes | None]] | None:
    """Any headers at all (seeded): none, junk, None values, several content-types."""
    if rng.random() < 0.25:
        return None
    values = [*_JSON_TYPES, *_MSGPACK_TYPES, *_BAD_TYPES, None]
    return [(rng.choice(_CT_KEYS + _OTHER_KEYS),
             rng.choice(values) if rng.random() < 0.7 else rng.randbytes(rng.randint(0, 24)))
            for _ in range(rng.randint(0, 3))]


def headers_from(rng: random.Random, fmt: str) -> list[tuple[str, bytes | None]] | None:
    """Mostly headers announcing ``fmt``; sometimes any headers at all."""
    return _rng_headers(rng, fmt) if rng.random() < 0.7 else hostile_headers_from(rng)


RAW_KINDS = ["none", "binary", "json-shaped", "msgpack-shaped", "damaged", "deep", "bomb",
             "big", "valid"]


def raw_from_seed(kind: str, seed: int) -> bytes | None:
    """A record value of one of :data:`RAW_KINDS`, from a seed."""
    rng = random.Random(seed)
    if kind == "none":
        return None
    if kind == "binary":
        return rng.randbytes(rng.choice([0, 1, 2, 8, rng.randint(0, 600)]))
    if kind in ("json-shaped", "msgpack-shaped"):
        return json_from_seed(seed, kind == "msgpack-shaped")
    if kind == "damaged":
        return _damaged_request(seed)
    if kind == "deep":
        nested = deep_value(rng.choice([10_000, 100_000, 200_000, rng.randint(1, 20_000)]),
                            rng.random() < 0.5)
        return nested.json if rng.random() < 0.5 else nested.mp
    if kind == "bomb":
        if rng.random() < 0.5:
            return rng.choice(BOMBS)
        return (rng.choice([b"\xdd", b"\xdf", b"\xdb", b"\xc6"])
                + struct.pack(">I", rng.randint(1 << 20, 2**32 - 1))
                + rng.randbytes(rng.randint(0, 16)))
    if kind == "big":
        n = rng.choice([2_001, 65_536, 1 << 20, 5_000_000, rng.randint(1, 100_000)])
        return b'{"id": "r-1", "x": "' + b"a" * n + b'"}'
    b = base_from_seed(seed)
    return body(b.fields, b.fmt)


class Raw(NamedTuple):
    """A record value by recipe: :meth:`value` builds it each time it is asked for.

    Strategies yield this, not the bytes: hypothesis keeps every generated
    argument alive until its run ends, and 10,000 values of up to 5 MB would
    hold gigabytes.
    """

    kind: str
    seed: int

    def value(self) -> bytes | None:
        return raw_from_seed(self.kind, self.seed)


@functools.cache
def hostile_bytes() -> st.SearchStrategy[Raw]:
    """Anything a producer could put in a record value (two draws: a kind and a seed)."""
    return st.builds(Raw, st.sampled_from(RAW_KINDS), _SEEDS)


# -- a deterministic burst, for the integration test --------------------------------------


class BurstRecord(NamedTuple):
    """One ingress record of a burst and what admission must make of it."""

    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    label: str
    #: The request id an answer would carry (None: no id can be read).
    rid: str | None
    good: bool = False
    #: Must be dead-lettered; must get an ``invalid`` result (on ``answer_to``).
    dead: bool = False
    answered: bool = False
    answer_to: str | None = None


#: label -> (fields to set, or a callable on the request dict; dead; answered). The
#: dict is a valid acme/embed request whose id is "bad-<n>".
_BURST_FAULTS: dict[str, tuple[Any, bool, bool]] = {
    "unknown_org": ({"org": "nobody"}, False, True),
    "claimed_tier": ({"tier": "enterprise"}, False, True),
    "claimed_weight": ({"weight": 1000.0}, False, True),
    "priority_above_cap": ({"org": "trial", "priority": 3}, False, True),
    "unknown_endpoint": ({"endpoint": "generate"}, False, True),
    "input_kind_mismatch": ({"input": {"type": "rerank", "query": "q", "documents": ["d"]}},
                            False, True),
    "too_many_texts": ({"input": {"type": "embed", "texts": ["a"] * 9}}, False, True),
    "text_too_long": ({"input": {"type": "embed", "texts": ["x" * 51]}}, False, True),
    "too_many_tokens": ({"input": {"type": "embed", "texts": ["w " * 21]}}, False, True),
    "message_too_large": ({"padding": "p" * 3000}, False, True),
    "missing_input": (lambda d: d.pop("input"), True, True),
    "bad_priority_type": ({"priority": "high"}, True, True),
    "huge_top_n": ({"endpoint": "rerank", "input": {"type": "rerank", "query": "q",
                                                    "documents": ["d"], "top_n": 10**30}},
                   True, True),
    "trailing_newline_org": ({"org": "acme\n"}, True, True),
    "bad_id": ({"id": "bad id/../\u00fc"}, True, False),
}


def hostile_burst(prefix: str, count: int, seed: int, *, good_every: int = 10,
                  reply_topic: str | None = None) -> list[BurstRecord]:
    """``count`` hostile ingress records with a good one every ``good_every``, for a
    deployment with ``topic_prefix = prefix`` and the registry of tests/admission_setup.
    Deterministic for a given seed."""
    topics = Topics(prefix)
    reply_prefix = f"{prefix}replies."
    rng = random.Random(seed)
    out: list[BurstRecord] = []
    n_bad = 0
    while n_bad < count:
        if good_every and len(out) % good_every == 0:
            rid = f"good-{len(out)}"
            out.append(BurstRecord(msgspec.json.encode(
                {"id": rid, "org": "acme", "endpoint": "embed",
                 "input": {"type": "embed", "texts": ["hello world"]}}), None, "good", rid,
                good=True))
            continue
        rid = f"bad-{n_bad}"
        n_bad += 1
        base = {"id": rid, "org": "acme", "endpoint": "embed",
                "input": {"type": "embed", "texts": ["hello world"]}}
        reply = rng.choice([None, reply_topic]) if reply_topic else None
        if reply:
            base["reply_to"] = reply
        answer_to = reply or topics.results
        kind = rng.choice([*_BURST_FAULTS, "reply_outside_prefix", "illegal_reply_to",
                           "bad_content_type", "non_ascii_content_type", "garbage",
                           "deep_nesting", "msgpack_bomb", "truncated", "invalid_utf8",
                           "nan_literal", "tombstone", "format_mismatch", "shaped",
                           "damaged"])
        if kind in _BURST_FAULTS:
            change, is_dead, answered = _BURST_FAULTS[kind]
            if callable(change):
                change(base)
            else:
                base.update(change)
            rec = BurstRecord(msgspec.json.encode(base), None, kind, rid, dead=is_dead,
                              answered=answered, answer_to=answer_to)
        elif kind == "reply_outside_prefix":
            base["reply_to"] = rng.choice([topics.tier("enterprise"), topics.dead_letters,
                                           topics.batches("embed"), "replies.x",
                                           reply_prefix.rstrip(".")])
            rec = BurstRecord(msgspec.json.encode(base), None, kind, rid, answered=True,
                              answer_to=topics.results)
        elif kind == "illegal_reply_to":
            base["reply_to"] = reply_prefix + rng.choice(["\u00fc/../x", "a b", "x" * 300,
                                                          "x\n"])
            rec = BurstRecord(msgspec.json.encode(base), None, kind, rid, dead=True,
                              answered=True, answer_to=topics.results)
        elif kind in ("bad_content_type", "non_ascii_content_type"):
            ct = rng.choice([b"text/xml", b"application/cbor"]) if kind == "bad_content_type" \
                else rng.choice([b"\xff\xfe", b"application/j\xc3\xa9son"])
            rec = BurstRecord(msgspec.json.encode(base), [("content-type", ct)], kind, rid,
                              dead=True, answered=True, answer_to=answer_to)
        elif kind == "garbage":
            rec = BurstRecord(b"\xff" + rng.randbytes(rng.randint(0, 300)), None, kind, None,
                              dead=True)
        elif kind == "deep_nesting":
            nested = deep_value(rng.choice([1_000, 10_000, 100_000]), rng.random() < 0.5)
            rec = BurstRecord(nested.json, None, kind, None, dead=True)
        elif kind == "msgpack_bomb":
            rec = BurstRecord(rng.choice(BOMBS), [("content-type", b"application/msgpack")],
                              kind, None, dead=True)
        elif kind == "truncated":
            data = msgspec.json.encode(base)
            rec = BurstRecord(data[:rng.randint(0, len(data) - 1)], None, kind, None, dead=True)
        elif kind == "invalid_utf8":
            rec = BurstRecord(msgspec.json.encode(base).replace(b'"acme"', b'"ac\xffme"'), None,
                              kind, None, dead=True)
        elif kind == "nan_literal":
            rec = BurstRecord(msgspec.json.encode(base)[:-1] + b', "priority": NaN}', None, kind,
                              None, dead=True)
        elif kind == "tombstone":
            rec = BurstRecord(None, None, kind, None, dead=True)
        elif kind == "format_mismatch":
            rec = BurstRecord(msgspec.msgpack.encode(base), None, kind, None, dead=True)
        else:
            # Request-shaped values with hostile leaves, or a valid request damaged at
            # the byte level, behind a byte no JSON starts with: whatever they would
            # have decoded to (checked by the fuzz tests), here they are dead letters.
            data = json_from_seed(rng.getrandbits(64), False) if kind == "shaped" else \
                damage(msgspec.json.encode(base), rng)
            rec = BurstRecord(b"\xff" + data, None, kind, None, dead=True)
        out.append(rec)
    return out
