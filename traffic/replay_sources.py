"""Where replayed traffic comes from: a traffic log, or a time window of a topic.

Both give a list of :class:`ReplayItem` in time order, ``ts`` in seconds
from the first, each a :class:`~schemas.messages.Request` as it was
recorded (original id) with its token count. :mod:`traffic.replay` sends
them; :func:`to_trace` turns them back into a trace for ``simulate``.

* :func:`items_from_trace`: one request per trace line; a line with only
  ``tokens`` gets texts made up to that count (:mod:`traffic.textsynth`).
  A line's ``options`` go into the request's input as they are (an option
  of the other input kind is a :class:`ReplayError`).
* :func:`read_window`: the requests a topic holds between two times. Each
  partition is read from ``offsets_for_times(since)`` up to its first record
  past ``until``, or up to its high watermark *as of the first fetch*
  (``end_offsets()`` is wrong on Tansu), so a replay into the topic it reads
  never reads itself. Records before ``since`` are passed over: Tansu 0.6
  answers ``offsets_for_times`` with offset 0 whatever the time (measured
  with aiokafka 0.14), so there the lookup is only a lower bound and the
  partition is read from its start. Records that are not requests are
  skipped and listed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer
from plumbing.topics import describe_topics
from schemas.codec import DecodeError, Format, codec_for, format_from_headers
from schemas.config import Config
from schemas.messages import EmbedInput, Input, Request, RerankInput
from schemas.options import RequestOptions
from traffic.textsynth import TextSynth
from traffic.trace import TraceRecord

__all__ = [
    "ReplayError",
    "ReplayItem",
    "Window",
    "items_from_trace",
    "options_of",
    "parse_time_ms",
    "read_window",
    "to_trace",
]

_request_codec = codec_for(Request)


class ReplayError(RuntimeError):
    """The replay cannot start (bad window, missing topic...); the message says why."""


@dataclass(frozen=True)
class ReplayItem:
    """One request to re-send: when (seconds from the first), what, and where it came from."""

    ts: float
    #: As recorded: original id; ``reply_to``/``created_ms`` are replaced at send.
    request: Request
    #: Tokens as admission counts them (the trace's own count for a trace).
    tokens: int
    #: ``topic/partition/offset`` for a topic window, None for a trace.
    origin: str | None = None
    #: The request's wire format (a topic record keeps its own).
    wire_format: Format = "json"


@dataclass
class Window:
    """What :func:`read_window` found: the items, and records it could not use."""

    items: list[ReplayItem]
    #: partition -> (first offset read, offset after the last one read)
    ranges: dict[int, tuple[int, int]]
    #: ``topic/partition/offset: reason`` of records that are not requests.
    skipped: list[str] = field(default_factory=list)


def parse_time_ms(text: str) -> int:
    """``--since``/``--until``: ISO-8601 (no zone = UTC) or epoch seconds, to epoch ms."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{text!r} is neither ISO-8601 nor epoch seconds") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    if seconds >= 1e11:
        raise ValueError(f"{text!r} looks like epoch milliseconds; give seconds")
    return int(seconds * 1000)


def items_from_trace(records: Sequence[TraceRecord], config: Config,
                     synth_for: Callable[[str], TextSynth]) -> list[ReplayItem]:
    """Requests for trace records; texts are made up where a line has only ``tokens``.

    ``synth_for(endpoint)`` gives the text maker of the endpoint's tokenizer.
    A line with texts keeps them and counts as admission counts them (the
    trace reader only estimates texts); a rerank line without a query gets
    a one-word one. An endpoint the configuration does not know is sent as
    ``embed`` (admission answers it ``invalid``, as it would live).
    """
    items = []
    for r in records:
        ep = config.endpoints.get(r.endpoint)
        kind = ep.kind if ep is not None else "embed"
        synth = synth_for(r.endpoint)
        tokens = r.tokens
        if r.texts is not None and kind == "rerank":
            query = r.query if r.query is not None else synth.rerank(1, r.id)[0]
            inp: EmbedInput | RerankInput = RerankInput(query=query, documents=tuple(r.texts))
            tokens = synth.count(inp)
        elif r.texts is not None:
            inp = EmbedInput(texts=tuple(r.texts))
            tokens = synth.count(inp)
        else:
            inp = synth.make_input(kind, r.tokens, r.id)
        inp = _with_options(inp, r)
        req = Request(id=r.id, org=r.org, endpoint=r.endpoint, input=inp, priority=r.priority,
                      deadline_ms=r.deadline_ms)
        items.append(ReplayItem(ts=r.ts, request=req, tokens=tokens))
    return items


def _with_options(inp: Input, r: TraceRecord) -> Input:
    """``inp`` with the trace line's options; ReplayError for options of the other kind."""
    if r.options is None:
        return inp
    kind = "embed" if isinstance(inp, EmbedInput) else "rerank"
    foreign = r.options.foreign_to(kind)
    if foreign:
        raise ReplayError(f"trace request {r.id!r}: option(s) {', '.join(foreign)} do not apply "
                          f"to a {kind} request (endpoint {r.endpoint!r})")
    fields = r.options.embed_fields() if kind == "embed" else r.options.rerank_fields()
    return msgspec.structs.replace(inp, **fields)


def options_of(inp: Input) -> RequestOptions | None:
    """The options a request's input carries (those not at their defaults), for a trace line."""
    given = {name: getattr(inp, name) for name in RequestOptions.__struct_fields__
             if hasattr(inp, name)}
    defaults = EmbedInput(texts=("",)) if isinstance(inp, EmbedInput) else \
        RerankInput(query="", documents=("",))
    given = {k: v for k, v in given.items() if v != getattr(defaults, k)}
    return RequestOptions(**given) if given else None


async def read_window(settings: KafkaSettings, topic: str, since_ms: int,
                      until_ms: int | None = None, *, timeout_s: float = 60.0,
                      count: Callable[[Request], int] | None = None) -> Window:
    """The requests ``topic`` holds with ``since_ms <= timestamp <= until_ms``, in time order.

    Each partition is read up to its first record past ``until_ms`` or up
    to its high watermark as of the first fetch, whichever comes first;
    records stamped before ``since_ms`` are passed over.
    ``count`` gives each request's tokens (default: 0, unknown).
    """
    if until_ms is not None and until_ms < since_ms:
        raise ReplayError("--until is before --since")
    partitions = (await describe_topics(settings, topic)).get(topic)
    if partitions is None:
        raise ReplayError(f"topic {topic!r} does not exist")
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    taken: list[Any] = []
    ranges: dict[int, tuple[int, int]] = {}
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
        # partition -> [next offset, bound (high watermark at the first fetch)]
        todo: dict[TopicPartition, list[int | None]] = {}
        for tp in tps:
            hit = found.get(tp)
            if hit is not None:
                consumer.seek(tp, hit.offset)
                todo[tp] = [hit.offset, None]
                ranges[tp.partition] = (hit.offset, hit.offset)
        idle = [tp for tp in tps if tp not in todo]
        if idle:
            consumer.pause(*idle)
        async with asyncio.timeout(timeout_s):
            while todo:
                got = await consumer.getmany(*todo, timeout_ms=200)
                for tp in list(todo):
                    state = todo[tp]
                    if state[1] is None:
                        state[1] = consumer.highwater(tp)
                    finished = False
                    for rec in got.get(tp, []):
                        past_end = state[1] is not None and rec.offset >= state[1]
                        if past_end or (until_ms is not None and rec.timestamp > until_ms):
                            finished = True
                            break
                        state[0] = rec.offset + 1
                        if rec.timestamp >= since_ms:
                            taken.append(rec)
                    assert state[0] is not None, "only the bound starts unknown"
                    if finished or (state[1] is not None and state[0] >= state[1]):
                        ranges[tp.partition] = (ranges[tp.partition][0], state[0])
                        consumer.pause(tp)
                        del todo[tp]
    except TimeoutError:
        raise ReplayError(f"reading {topic!r} took longer than {timeout_s:g} s") from None
    finally:
        await consumer.stop()
    taken.sort(key=lambda rec: (rec.timestamp, rec.partition, rec.offset))
    items: list[ReplayItem] = []
    skipped: list[str] = []
    first_ms = taken[0].timestamp if taken else 0
    for rec in taken:
        where = f"{rec.topic}/{rec.partition}/{rec.offset}"
        try:
            fmt = format_from_headers(rec.headers)
            req = _request_codec.decode(rec.value, fmt)
        except DecodeError as e:
            skipped.append(f"{where}: {e}")
            continue
        items.append(ReplayItem(ts=(rec.timestamp - first_ms) / 1000.0, request=req,
                                tokens=count(req) if count else 0, origin=where,
                                wire_format=fmt))
    return Window(items, ranges, skipped)


def to_trace(items: Iterable[ReplayItem], speed: float = 1.0) -> list[TraceRecord]:
    """The replayed traffic as a trace (time scaled by ``speed``), for ``simulate``."""
    out = []
    for it in items:
        r = it.request
        out.append(TraceRecord(ts=round(it.ts / speed, 6), org=r.org, endpoint=r.endpoint,
                               tokens=max(1, it.tokens), id=r.id, priority=r.priority,
                               deadline_ms=r.deadline_ms, options=options_of(r.input)))
    return out

