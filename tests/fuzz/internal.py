"""Internal-topic messages for the fuzz tests: valid ones from a seed, hostile records.

Every builder takes a ``random.Random`` so that one hypothesis draw (the seed)
stands for a whole message; the same seed always gives the same message.

* ``admitted_from``, ``batch_from``, ``event_from``, ``state_from``: any message the
  schema allows, with extreme values (int64 bounds, far-past and far-future times,
  NaN and infinities where ``finite`` is false, names of every length);
* :func:`hostile_record_from`: a record meant for a type's topic, of one of
  :data:`KINDS` (raw bytes, message-shaped values with hostile leaves, a valid
  message with a field made hostile, a damaged encoding, deep nesting, a msgpack
  bomb, no value at all), with headers that mostly announce its encoding.
"""

from __future__ import annotations

import math
import random
import string
from typing import Any

import msgspec
from hypothesis import strategies as st

from schemas.codec import codec_for
from schemas.messages import (
    AdmittedRequest,
    Batch,
    BatchTiming,
    EmbedInput,
    LaneState,
    RerankInput,
    SchedulerState,
    WorkerEvent,
)
from tests.fuzz.hostile import (
    BOMBS,
    EVIL_STRINGS,
    NOW_MS,
    REPLY_PREFIX,
    TOPICS,
    damage,
    deep_value,
    headers_from,
    json_from_seed,
    random_value,
)

__all__ = [
    "BUILDERS",
    "KINDS",
    "admitted_from",
    "batch_from",
    "encode_as",
    "event_from",
    "hostile_record",
    "hostile_record_from",
    "int64_from",
    "state_from",
    "text_from",
]

_ID_CHARS = string.ascii_letters + string.digits + "._:-"
_NAME_CHARS = string.ascii_letters + string.digits + "._-"
_TEXT_CHARS = string.ascii_letters + " \u00e9\u4e2d\U0001f600\"\\"
_SEEDS = st.integers(0, 2**64 - 1)

# -- valid messages, from a seed ---------------------------------------------------------


def _name(rng: random.Random, chars: str = _NAME_CHARS, most: int = 64) -> str:
    return "".join(rng.choices(chars, k=rng.randint(1, rng.choice([3, 12, most]))))


def text_from(rng: random.Random, most: int = 30) -> str:
    return "".join(rng.choices(_TEXT_CHARS, k=rng.randint(0, most)))


def _float(rng: random.Random, finite: bool) -> float:
    pool = [0.0, -0.0, 1.5, -1e308, 1e308, 5e-324, rng.uniform(-1e9, 1e9)]
    if not finite:
        pool += [math.nan, math.inf, -math.inf]
    return rng.choice(pool)


def int64_from(rng: random.Random) -> int:
    return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)])


def admitted_from(rng: random.Random) -> AdmittedRequest:
    """Any AdmittedRequest the schema allows (not only what admission would emit)."""
    if rng.random() < 0.5:
        inp: EmbedInput | RerankInput = EmbedInput(
            texts=tuple(text_from(rng) for _ in range(rng.randint(1, 5))))
    else:
        inp = RerankInput(query=text_from(rng), documents=tuple(text_from(rng) for _ in range(rng.randint(1, 5))),
                          top_n=rng.choice([None, 1, 3, 2**63 - 1]))
    return AdmittedRequest(
        id=_name(rng, _ID_CHARS, 128), org=_name(rng), endpoint=rng.choice(["embed", "rerank",
                                                                            _name(rng)]),
        tier=rng.choice(["enterprise", "standard", "free", "", text_from(rng)]), input=inp,
        tokens=rng.choice([1, 20, 21, 2**31, 2**63 - 1, rng.randint(1, 100)]),
        priority=rng.randint(0, 100),
        deadline_at_ms=rng.choice([None, 0, NOW_MS - 1, NOW_MS + 10**9, 10**14]),
        created_ms=rng.choice([0, NOW_MS, 10**14]), admitted_ms=rng.choice([0, NOW_MS, 10**14]),
        reply_to=rng.choice([TOPICS.results, REPLY_PREFIX + _name(rng),
                             TOPICS.tier("enterprise"), _name(rng, most=249)]),
        reply_format=rng.choice(["json", "msgpack"]),
    )


def batch_from(rng: random.Random) -> Batch:
    return Batch(id=text_from(rng, 40), endpoint=rng.choice(["embed", "rerank", _name(rng)]),
                 requests=[admitted_from(rng) for _ in range(rng.randint(0, 4))],
                 tokens=int64_from(rng), created_ms=rng.choice([0, NOW_MS, 10**14]),
                 worker=text_from(rng, 20), epoch=int64_from(rng))


def event_from(rng: random.Random, finite: bool = True) -> WorkerEvent:
    return WorkerEvent(
        worker=text_from(rng, 20), endpoint=rng.choice(["embed", "rerank", _name(rng)]),
        kind=rng.choice(["hello", "heartbeat", "batch_done", "bye"]),
        partitions=[rng.choice([0, 1, 3, 4, 99, -1, -(2**63), 2**63 - 1])
                    for _ in range(rng.randint(0, 4))],
        slots=rng.randint(0, 1024), free_slots=rng.randint(0, 1024),
        sent_ms=rng.choice([0, NOW_MS, NOW_MS - 60_000, 10**14]),
        in_flight=[text_from(rng, 10) for _ in range(rng.randint(0, 3))],
        batch_id=rng.choice([None, "", text_from(rng, 10)]), batch_requests=int64_from(rng),
        batch_tokens=int64_from(rng), inference_ms=_float(rng, finite),
        timings=[BatchTiming(org=_name(rng), tokens=int64_from(rng), seconds=_float(rng, finite))
                 for _ in range(rng.randint(0, 3))],
    )


def _lane(rng: random.Random, finite: bool) -> LaneState:
    tiers = ["enterprise", "standard", "free", _name(rng)]
    return LaneState(
        endpoint=rng.choice(["embed", "rerank"]), held_requests=int64_from(rng),
        held_cost_by_tier={t: _float(rng, finite) for t in rng.sample(tiers, rng.randint(0, 4))},
        held_tokens_by_tier={t: int64_from(rng) for t in rng.sample(tiers, rng.randint(0, 4))},
        tokens_per_s=_float(rng, finite), free_slots=int64_from(rng), workers=int64_from(rng),
        active_orgs_by_tier={t: int64_from(rng) for t in rng.sample(tiers, rng.randint(0, 4))},
        org_held_tokens={o: int64_from(rng) for o in rng.sample(["acme", "trial", "bulk", "x"],
                                                            rng.randint(0, 4))},
    )


def state_from(rng: random.Random, finite: bool = True) -> SchedulerState:
    return SchedulerState(
        sent_ms=rng.choice([0, NOW_MS, NOW_MS - 1_000, NOW_MS + 10**9, 10**14]),
        lanes={k: _lane(rng, finite) for k in rng.sample(["embed", "rerank", "x"],
                                                        rng.randint(0, 3))},
        held_requests=int64_from(rng), epoch=int64_from(rng))


BUILDERS: dict[type, Any] = {
    AdmittedRequest: lambda rng, finite: admitted_from(rng),
    Batch: lambda rng, finite: batch_from(rng),
    WorkerEvent: event_from,
    SchedulerState: state_from,
}

# -- hostile records for one message type --------------------------------------------------

_HOSTILE_LEAVES: list[Any] = [
    None, True, -1, 0, 2**64 - 1, -(2**63), 1.5, "", "x" * 10_000, [], {}, [[[[]]]],
    {"type": "nope"}, *EVIL_STRINGS[:12],
]


def _replace_somewhere(obj: Any, rng: random.Random, msgpack: bool) -> Any:
    """``obj`` (plain builtins) with one value, at any depth, made hostile."""
    if isinstance(obj, dict) and obj and rng.random() < 0.8:
        key = rng.choice(list(obj))
        return {**obj, key: _replace_somewhere(obj[key], rng, msgpack)}
    if isinstance(obj, list) and obj and rng.random() < 0.8:
        i = rng.randrange(len(obj))
        return [*obj[:i], _replace_somewhere(obj[i], rng, msgpack), *obj[i + 1:]]
    if rng.random() < 0.5:
        return rng.choice(_HOSTILE_LEAVES + ([math.nan, math.inf, b"\xff"] if msgpack else []))
    return random_value(rng, msgpack, 2)


def encode_as(obj: Any, fmt: str) -> bytes:
    return msgspec.json.encode(obj) if fmt == "json" else msgspec.msgpack.encode(obj)


def _mutated(typ: type, seed: int) -> tuple[bytes, str]:
    rng = random.Random(seed)
    fmt = rng.choice(["json", "msgpack"])
    plain = msgspec.to_builtins(BUILDERS[typ](rng, True))
    for _ in range(rng.randint(1, 2)):
        plain = _replace_somewhere(plain, rng, fmt == "msgpack")
    if rng.random() < 0.2 and isinstance(plain, dict) and plain:
        plain.pop(rng.choice(list(plain)))  # a required field missing
    return encode_as(plain, fmt), fmt


KINDS = ["binary", "shaped", "mutated", "damaged", "deep", "bomb", "none"]


def hostile_record_from(typ: type, kind: str, seed: int) -> tuple[bytes | None, Any, str]:
    """(value, headers, kind) of a hostile record meant for ``typ``'s topic, from a seed."""
    rng = random.Random(seed)
    fmt = rng.choice(["json", "msgpack"])
    if kind == "binary":
        value = rng.randbytes(rng.choice([0, 1, 8, rng.randint(0, 400)]))
    elif kind == "shaped":
        keys = (*tuple(typ.__struct_fields__), "type", "texts", "lanes", "timings")
        value = json_from_seed(seed, fmt == "msgpack", keys)
    elif kind == "mutated":
        value, fmt = _mutated(typ, seed)
    elif kind == "damaged":
        value = damage(codec_for(typ).encode(BUILDERS[typ](rng, True), fmt), rng)
    elif kind == "deep":
        depth = rng.choice([1_000, 10_000, 200_000, rng.randint(1, 20_000)])
        nested = deep_value(depth, rng.random() < 0.5)
        value = nested.json if fmt == "json" else nested.mp
    elif kind == "bomb":
        value, fmt = rng.choice(BOMBS), "msgpack"
    else:
        value = None
    return value, headers_from(rng, fmt), kind


_HOSTILE_RECORDS = {
    t: st.tuples(st.sampled_from(KINDS), _SEEDS).map(
        lambda ks, t=t: hostile_record_from(t, *ks))
    for t in (AdmittedRequest, Batch, WorkerEvent, SchedulerState)
}


def hostile_record(typ: type) -> st.SearchStrategy[tuple[bytes | None, Any, str]]:
    """(value, headers, label) of a hostile record meant for ``typ``'s topic."""
    return _HOSTILE_RECORDS[typ]
