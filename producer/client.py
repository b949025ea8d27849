"""The client library for upstream services: submit a request, await its one result.

::

    async with FairnessClient(settings, config) as client:
        request_id = await client.submit({"org": "acme", "endpoint": "embed",
                                          "input": {"type": "embed", "texts": ["hi"]}})
        result = await client.result(request_id, timeout=30)

Each client reads results from a reply topic of its own,
``<prefix>replies.<client-id>`` (created on start, one partition), unless one
is given. Results can arrive more than once (a scheduler replay, a worker
redelivery); the client delivers each request id's result **once**: to the
caller awaiting :meth:`FairnessClient.result` for that id if there is one,
else to the next reader of :meth:`FairnessClient.results` (or a later
``result(id)`` call). Later copies are dropped. The client remembers the last
``remember_ids`` delivered ids for that.

Results come one to a record, or several to a record (a ``ResultPack``,
:mod:`schemas.packs`) when the request asked (``reply_packed``): the client
asks for its reply topic unless ``packed_replies`` is off, and reads both
forms, each result of a pack delivered as if it came alone. A result that
does not decode (a bad record, a bad item of a pack, a pack that cannot be
read at all) is logged and skipped; the reader goes on.

Only results that arrive after the client started are read: a given,
shared reply topic may hold older ones (records older than the start minus
``clock_skew_ms`` are skipped).

A broker that loses its topics (the embedded Tansu broker restarted) loses
the requests in flight with them. The client notices (its reply topic
missing or re-created, see :mod:`plumbing.topickeeper`), recreates its
reply topic and reads it again from the start. A request submitted before
that and still without a result ``lost_grace_s`` later (some get through:
the producer retried them once the topics were back) fails with
:class:`ResultLost` (a ``TimeoutError``): at once for a caller awaiting it,
on the next :meth:`FairnessClient.result` call otherwise. A result that
still arrives for one of them after that goes to :meth:`FairnessClient.results`.

Request options (:mod:`schemas.options`) go in the input as any other field;
:func:`embed_input` and :func:`rerank_input` build inputs with them, checked
before anything is sent. :func:`decode_embeddings` turns a result's
embeddings, whatever their type and encoding, into numpy arrays::

    inp = embed_input(["hi"], input_type="search_query", dimensions=256,
                      embedding_types=["float", "int8"], encoding="base64")
    result = await client.result(await client.submit({"org": "acme", "endpoint": "embed",
                                                      "input": inp}))
    arrays = decode_embeddings(result)   # {"float": (1, 256) float32, "int8": (1, 256) int8}

Also the ``submit`` subcommand: send one request, print its result as JSON;
it takes every option as a flag (``--truncate none``, ``--dimensions 256``...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from plumbing.bounded import cancel_within, stop_within, within
from plumbing.kafka import (
    Consumer,
    KafkaSettings,
    Producer,
    add_kafka_arguments,
    make_consumer,
    make_producer,
    settings_from_args,
)
from plumbing.logs import get_logger
from plumbing.service import StartStop
from plumbing.topickeeper import TopicKeeper
from plumbing.topics import ensure_topics
from schemas.codec import DecodeError, Format, codec_for, content_type
from schemas.config import Config, ConfigError, load_config
from schemas.messages import EmbedInput, Request, RerankInput, Result
from schemas.options import RequestOptions
from schemas.packs import messages_in
from schemas.topics import Topics
from schemas.vectors import decode_embeddings

__all__ = [
    "FairnessClient",
    "ResultLost",
    "add_arguments",
    "decode_embeddings",
    "embed_input",
    "rerank_input",
    "result_for_display",
    "results_in",
    "run",
]

log = get_logger("client")

_request_codec = codec_for(Request)
_ILLEGAL = re.compile(r"[^A-Za-z0-9._\-]")


class ResultLost(TimeoutError):
    """The broker lost a submitted request or the reply topic: resubmit it.

    A ``TimeoutError``, so callers that handle a timeout handle this too.
    """

    def __init__(self, request_id: str, why: str):
        self.request_id = request_id
        super().__init__(f"request {request_id!r} was lost: {why}; submit it again")


class FairnessClient(StartStop):
    """Submits requests to the ingress topic and hands back each result once.

    ``config_or_prefix`` is the deployment's :class:`Config` or just its
    topic prefix (then the reply prefix is the default ``replies.``).
    ``packed_replies`` (default on): requests answered on this client's reply
    topic ask for their results packed, several to a record, which cuts the
    records (and the fetches) a burst of results costs; it is off for the
    shared results topic (admission never packs there), and should be turned
    off for a given ``reply_topic`` that readers older than packs also read.
    Fixed at construction: topics, encoding, client id, packing. The delivery tables
    are mutated only by the reader task and the public coroutines.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        config_or_prefix: Config | str = "sf.",
        reply_topic: str | None = None,
        *,
        client_id: str | None = None,
        wire_format: Format = "json",
        remember_ids: int = 100_000,
        clock_skew_ms: int = 60_000,
        lost_grace_s: float = 10.0,
        stop_timeout_s: float = 10.0,
        keep_unclaimed: bool = True,
        packed_replies: bool = True,
        max_in_flight: int | None = None,
        in_flight_wait_s: float = 60.0,
    ):
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be 1 or more, not {max_in_flight}")
        if isinstance(config_or_prefix, Config):
            self.topics = Topics.of(config_or_prefix)
            reply_prefix = self.topics.reply_prefix(config_or_prefix)
        else:
            self.topics = Topics(config_or_prefix)
            reply_prefix = f"{config_or_prefix}replies."
        self.settings = settings
        self.client_id = client_id or f"{settings.client_id}-{uuid.uuid4().hex[:12]}"
        self._owns_topic = reply_topic is None
        self.reply_topic = reply_topic or reply_prefix + _ILLEGAL.sub("-", self.client_id)
        #: Encoding of submitted requests (results come back in the same).
        self.wire_format: Format = wire_format
        #: How many delivered ids are remembered to drop later copies.
        self.remember_ids = remember_ids
        #: Results stamped this long before the start still count (clock skew).
        self.clock_skew_ms = clock_skew_ms
        #: After the broker lost the reply topic, how long requests submitted
        #: before get to bring a result before they count as lost.
        self.lost_grace_s = lost_grace_s
        #: How long each step of :meth:`stop` may take before it is left behind.
        self.stop_timeout_s = stop_timeout_s
        #: False: a result nobody submitted through this client or still awaits
        #: (abandoned with :meth:`abandon`, or older than the client) is dropped
        #: and counted in :attr:`unclaimed`, instead of kept for :meth:`results`.
        #: A gateway, whose every request has a waiter, holds nothing for nobody.
        self.keep_unclaimed = keep_unclaimed
        #: Requests answered on :attr:`reply_topic` ask for packed results.
        self.packed_replies = packed_replies and self.reply_topic != self.topics.results
        #: At most this many submitted without a result (None: no bound): a
        #: :meth:`submit` past it waits for one, up to ``in_flight_wait_s``. A bulk
        #: job's burst then waits here, not in an ingress partition it may share
        #: with other orgs (docs/load.md, "A bulk job's client").
        self.max_in_flight = max_in_flight
        self.in_flight_wait_s = in_flight_wait_s
        self._room = asyncio.Event()  # set whenever a request in flight ends
        self._stopping = False
        self.unclaimed = 0
        self.duplicates = 0
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._reader: asyncio.Task | None = None
        self._waiters: dict[str, asyncio.Future[Result]] = {}
        self._ready: OrderedDict[str, Result] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._arrived = asyncio.Event()
        self._started_ms = 0
        #: Submitted ids with no result yet (bounded like the rest).
        self._outstanding: OrderedDict[str, None] = OrderedDict()
        #: Ids the broker lost, and why (bounded).
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._suspected: set[str] = set()
        self._keeper: TopicKeeper | None = None
        #: Times the broker was seen to lose the reply topic.
        self.broker_losses = 0

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Create the reply topic if it is ours, connect, and start reading results."""
        self._started_ms = int(time.time() * 1000)
        self._stopping = False
        counts = await ensure_topics(self.settings, {self.reply_topic: 1})
        producer = self._producer = make_producer(self.settings)
        await producer.start()
        consumer = self._consumer = make_consumer(self.settings, group_id=None)
        await consumer.start()
        self._pace()
        keeper = self._keeper = TopicKeeper(self.settings, producer.client,
                                            lambda: {self.reply_topic: 1}, service="client",
                                            on_lost=self._reply_topic_lost,
                                            follow=lambda: [self._consumer])
        keeper.known(counts)
        await self._follow(counts[self.reply_topic], self._started_ms - self.clock_skew_ms)
        self._reader = asyncio.create_task(self._read(), name=f"client-{self.client_id}")
        keeper.start()

    def kafka_client(self) -> Any:
        """The producer's Kafka client (for a broker watch); the client must be started."""
        if self._producer is None:
            raise RuntimeError("FairnessClient is not started (use `async with`)")
        return self._producer.client

    async def _follow(self, partitions: int, since_ms: int) -> None:
        """Read every partition of the reply topic: ours from the start, a shared one by time."""
        tps = [TopicPartition(self.reply_topic, p) for p in range(partitions)]
        consumer = self._consumer
        assert consumer is not None, "the client is started"
        consumer.assign(tps)
        if self._owns_topic:
            await consumer.seek_to_beginning(*tps)
        else:
            # Tansu gets seek_to_end wrong: find the start by time instead.
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            missing = [tp for tp in tps if found.get(tp) is None]
            ends = await consumer.end_offsets(missing) if missing else {}
            for tp in tps:
                hit = found.get(tp)
                consumer.seek(tp, hit.offset if hit is not None else ends[tp])

    async def _reply_topic_lost(self) -> None:
        """The broker lost the reply topic (restart): follow the new one, fail what was in flight."""
        self.broker_losses += 1
        keeper = self._keeper
        assert keeper is not None, "the keeper that calls this is running"
        counts = await keeper.metadata([self.reply_topic]) or {}
        # The results written since the restart are in the new topic: read it all.
        await self._follow(counts.get(self.reply_topic, 1), int(time.time() * 1000) - 60_000)
        log.warning("reply_topic_lost", reply_topic=self.reply_topic,
                    in_flight=len(self._outstanding), grace_s=self.lost_grace_s,
                    detail="the broker lost its topics; requests in flight without a result "
                           "after the grace count as lost")
        self._suspect_in_flight()
        # Requests sent until the services recreated the ingress topic (about
        # one check of their keepers) may have landed nowhere too.
        asyncio.get_running_loop().call_later(2 * keeper.interval_s,
                                              self._suspect_in_flight)

    def _suspect_in_flight(self) -> None:
        suspects = [rid for rid in self._outstanding if rid not in self._suspected]
        self._suspected.update(suspects)
        asyncio.get_running_loop().call_later(self.lost_grace_s, self._declare_lost, suspects)

    def _declare_lost(self, suspects: list[str]) -> None:
        why = "the broker lost its topics (a restart?) while it was in flight"
        self._suspected.difference_update(suspects)
        lost = [rid for rid in suspects if rid in self._outstanding]
        for rid in lost:
            del self._outstanding[rid]
            self._lost[rid] = why
            fut = self._waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(ResultLost(rid, why))
        while len(self._lost) > self.remember_ids:
            self._lost.popitem(last=False)
        if lost:
            self._room.set()
        self._pace()
        if lost:
            log.warning("requests_lost", reply_topic=self.reply_topic, requests=len(lost),
                        detail="no result since the broker lost its topics; resubmit them")

    async def stop(self) -> None:
        """Stop reading and writing; each step bounded by ``stop_timeout_s``.

        A step that does not end in time (a library's shutdown waiting on a
        broker that does not answer) is logged with what it waited for and
        left behind: closing a client never hangs its caller.
        """
        limit = self.stop_timeout_s
        self._stopping = True
        self._room.set()  # a submit waiting for room ends now, not at its bound
        if self._keeper is not None:
            await stop_within(self._keeper.stop(), limit, "the client's topic keeper to stop",
                              log=log)
            self._keeper = None
        if self._reader is not None:
            await cancel_within([self._reader], limit, "the client's result reader to end",
                                log=log)
            self._reader = None
        for fut in self._waiters.values():
            fut.cancel()
        self._waiters.clear()
        if self._consumer is not None:
            await stop_within(self._consumer.stop(), limit, "the client's consumer to stop",
                              log=log)
            self._consumer = None
        if self._producer is not None:
            await stop_within(self._producer.stop(), limit, "the client's producer to stop",
                              log=log)
            self._producer = None

    # -- requests and results ------------------------------------------

    async def submit(self, request: Request | Mapping[str, Any]) -> str:
        """Send ``request`` to the ingress topic; returns its id.

        A dict gets an ``id`` (random), a ``reply_to`` (this client's topic)
        and a ``created_ms`` (now) when it has none, then is checked against
        the schema (``msgspec.ValidationError`` names a bad field). A
        :class:`Request` gets ``reply_to`` and ``created_ms`` the same way.
        One answered on this client's topic gets ``reply_packed`` from
        :attr:`packed_replies` (this client is its reader; see :meth:`asks_packed`).
        With ``max_in_flight`` set, a new id waits first until fewer than that
        many are in flight (``TimeoutError`` after ``in_flight_wait_s``).
        """
        if self._producer is None:
            raise RuntimeError("FairnessClient is not started (use `async with`)")
        rid = request.id if isinstance(request, Request) else request.get("id")
        if self.max_in_flight is not None and rid not in self._outstanding:
            await self._wait_for_room()  # before the stamp: created_ms is the send's time
        now = int(time.time() * 1000)
        if isinstance(request, Request):
            reply_to = request.reply_to or self.reply_topic
            req = msgspec.structs.replace(
                request,
                reply_to=reply_to,
                reply_packed=self.asks_packed(reply_to, request.reply_packed),
                created_ms=request.created_ms if request.created_ms is not None else now,
            )
        else:
            fields = dict(request)
            fields.setdefault("id", uuid.uuid4().hex)
            fields.setdefault("reply_to", self.reply_topic)
            fields.setdefault("created_ms", now)
            if fields["reply_to"] == self.reply_topic:
                fields["reply_packed"] = self.packed_replies
            req = msgspec.convert(fields, Request)
        # Outstanding from before the send: a send in progress when the broker
        # loses its topics may land nowhere, and must count as in flight.
        fresh = req.id not in self._seen and req.id not in self._outstanding
        if fresh:
            self._outstanding[req.id] = None
            while len(self._outstanding) > self.remember_ids:
                self._outstanding.popitem(last=False)
            self._pace()
        try:
            await self._producer.send_and_wait(
                self.topics.ingress,
                _request_codec.encode(req, self.wire_format),
                key=req.org.encode(),
                headers=[("content-type", content_type(self.wire_format).encode())],
            )
        except BaseException:
            if fresh:
                self._outstanding.pop(req.id, None)
                self._room.set()
                self._pace()
            raise
        return req.id

    async def _wait_for_room(self) -> None:
        """Until fewer than ``max_in_flight`` requests are in flight; ``TimeoutError`` after
        ``in_flight_wait_s`` seconds, saying how many were waited on."""
        limit = self.max_in_flight
        assert limit is not None
        deadline = time.monotonic() + self.in_flight_wait_s
        while len(self._outstanding) >= limit:
            if self._stopping:
                raise RuntimeError(f"FairnessClient stopped while a submit waited for room "
                                   f"(max_in_flight = {limit}): not sent")
            self._room.clear()
            try:
                await within(self._room.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise TimeoutError(
                    f"no result within {self.in_flight_wait_s:g} s for any of the "
                    f"{len(self._outstanding)} requests in flight (max_in_flight = {limit}) "
                    f"on reply topic {self.reply_topic!r}: not sent") from None

    def asks_packed(self, reply_to: str | None, asked: bool = False) -> bool:
        """``reply_packed`` for a request answered on ``reply_to``: this client's choice
        on its own reply topic (it reads it), else what the request ``asked``."""
        return self.packed_replies if reply_to == self.reply_topic else asked

    async def result(self, request_id: str, timeout: float | None = 30.0) -> Result:
        """The result of ``request_id``; raises ``TimeoutError`` naming the id after ``timeout`` s.

        Raises :class:`ResultLost` (a ``TimeoutError``) at once for a request
        the broker lost.
        """
        ready = self._ready.pop(request_id, None)
        if ready is not None:
            return ready
        if request_id in self._lost:
            raise ResultLost(request_id, self._lost[request_id])
        fut = self._waiters.get(request_id)
        if fut is None:
            fut = self._waiters[request_id] = asyncio.get_running_loop().create_future()
        try:
            return await within(asyncio.shield(fut), timeout)
        except ResultLost:
            raise
        except TimeoutError:
            raise TimeoutError(
                f"no result for request {request_id!r} within {timeout} s "
                f"on reply topic {self.reply_topic!r}"
            ) from None
        finally:
            if fut.done() or self._waiters.get(request_id) is fut:
                self._waiters.pop(request_id, None)

    def abandon(self, request_id: str) -> None:
        """Nobody waits for ``request_id`` any more (its caller went away): forget it.

        Its result, when it comes, is dropped (with ``keep_unclaimed`` off) or
        handed to :meth:`results`; nothing of it is held until then.
        """
        if request_id in self._outstanding:
            del self._outstanding[request_id]
            self._room.set()
        self._ready.pop(request_id, None)
        fut = self._waiters.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.cancel()
        if not self._outstanding:
            self._pace()

    def fail_waiting(self, exc: BaseException) -> int:
        """Raise ``exc`` in every :meth:`result` call still waiting; how many there were."""
        waiting = [f for f in self._waiters.values() if not f.done()]
        for fut in waiting:
            fut.set_exception(exc)
        return len(waiting)

    @property
    def waiting(self) -> int:
        """Requests submitted whose result has not come (bounded by ``remember_ids``)."""
        return len(self._outstanding)

    def lost_requests(self) -> dict[str, str]:
        """Submitted ids the broker lost (no result came since), with why."""
        return dict(self._lost)

    async def results(self) -> AsyncIterator[Result]:
        """Every result not awaited by :meth:`result`, in arrival order, each id once."""
        while True:
            while self._ready:
                _id, res = self._ready.popitem(last=False)
                yield res
            self._arrived.clear()
            await self._arrived.wait()

    # -- reading ---------------------------------------------------------

    async def _read(self) -> None:
        oldest_ms = self._started_ms - self.clock_skew_ms
        consumer = self._consumer
        assert consumer is not None, "started before this reader, stopped after it"
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=200)
            except KafkaError as e:
                log.warning("result_fetch_failed", topic=self.reply_topic, error=repr(e))
                await asyncio.sleep(0.5)
                continue
            for records in batches.values():
                for rec in records:
                    if rec.timestamp is not None and 0 <= rec.timestamp < oldest_ms:
                        continue
                    self._take(rec)

    def _take(self, rec: Any) -> None:
        """Deliver the results of one reply record; log (and skip) what does not decode."""
        for got in results_in(rec.value, rec.headers):
            if isinstance(got, DecodeError):
                log.warning("result_undecodable", topic=rec.topic, offset=rec.offset,
                            reason=got.reason, error=str(got))
                continue
            self._deliver(got)

    def _pace(self) -> None:
        """Poll the reply topic at ``fetch_max_wait_ms`` while a request is in flight, else idle.

        With nothing in flight nothing is due, and a fetch every 10 ms costs
        this process and the broker CPU for nothing. ``idle_fetch_max_wait_ms``
        is the busy wait by default: the embedded broker holds an empty fetch
        for its whole wait, so a longer one delays the first result after an
        idle spell (docs/benchmarks.md, "An idle client"); on a Kafka cluster
        it can be raised. A request that timed out stays in flight here until
        its result comes or it is forgotten (``remember_ids``).
        """
        if self._consumer is None:
            return
        s = self.settings
        wait = s.fetch_max_wait_ms if self._outstanding else s.idle_fetch_max_wait_ms
        if self._consumer.fetch_wait_ms != wait:
            self._consumer.set_fetch_wait(wait)

    def _deliver(self, res: Result) -> None:
        if res.id in self._seen:
            self.duplicates += 1
            return
        self._seen[res.id] = None
        while len(self._seen) > self.remember_ids:
            self._seen.popitem(last=False)
        claimed = res.id in self._outstanding
        if claimed:
            del self._outstanding[res.id]
            self._room.set()
            if not self._outstanding:
                self._pace()  # the last one in flight: nothing is due any more
        self._lost.pop(res.id, None)
        fut = self._waiters.pop(res.id, None)
        if fut is not None and not fut.done():
            fut.set_result(res)
            return
        if not self.keep_unclaimed and not claimed:
            self.unclaimed += 1
            return
        self._ready[res.id] = res
        while len(self._ready) > self.remember_ids:  # nobody is collecting: keep the newest
            self._ready.popitem(last=False)
        self._arrived.set()


def results_in(value: bytes | None,
               headers: Sequence[tuple[str, bytes]] | None) -> list[Result | DecodeError]:
    """The results one reply record carries, in order: its one result, or each item of a
    pack; one that does not decode (or a pack that cannot be read at all) as its
    :class:`DecodeError`, in its place (:func:`schemas.packs.messages_in`). Never raises
    one: a reader goes on past it."""
    return messages_in(Result, value, headers)


# -- request options -------------------------------------------------------------


def embed_input(texts: list[str], **options: Any) -> dict[str, Any]:
    """An embed input with ``options`` (names as in :mod:`schemas.options`), checked.

    Raises ``msgspec.ValidationError`` naming a bad option, ``ValueError`` for
    a rerank-only one.
    """
    return _input("embed", {"texts": list(texts)}, options)


def rerank_input(query: str, documents: list[str], top_n: int | None = None,
                 **options: Any) -> dict[str, Any]:
    """A rerank input with ``options`` (``max_tokens_per_doc``, ``return_documents``,
    ``truncate``), checked like :func:`embed_input`."""
    fields: dict[str, Any] = {"query": query, "documents": list(documents)}
    if top_n is not None:
        fields["top_n"] = top_n
    return _input("rerank", fields, options)


def _input(kind: str, fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    given = {k: v for k, v in options.items() if v is not None}
    checked = msgspec.convert(given, RequestOptions)
    foreign = checked.foreign_to(kind)
    if foreign:
        other = "rerank" if kind == "embed" else "embed"
        raise ValueError(f"{', '.join(foreign)}: {other} options, not for a {kind} input")
    inp = {"type": kind, **fields,
           **(checked.embed_fields() if kind == "embed" else checked.rerank_fields())}
    # The whole input against the wire schema, so what is sent decodes.
    msgspec.convert(inp, EmbedInput if kind == "embed" else RerankInput)
    return inp


def _add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """The request options as flags (see docs/requests.md "Request options")."""
    group = parser.add_argument_group("request options")
    group.add_argument("--input-type", help="embed: a prompt the endpoint lists (Cohere's name)")
    group.add_argument("--prompt-name", help="embed: a prompt the endpoint lists")
    group.add_argument("--truncate", choices=["none", "end", "start"],
                       help="cut the end (default) or the start of a too-long input, or refuse "
                            "it (none)")
    group.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="embed: unit-length vectors (--no-normalize: none at all; "
                            "default: the model's own behaviour)")
    group.add_argument("--dimensions", type=int, help="embed: keep the first N values")
    group.add_argument("--embedding-type", action="append", dest="embedding_types",
                       choices=["float", "int8", "uint8", "binary", "ubinary"],
                       help="embed: a type to return (repeat for several; default float)")
    group.add_argument("--encoding", choices=["float", "base64"],
                       help="embed: vectors as numbers (default) or packed bytes")
    group.add_argument("--max-tokens-per-doc", type=int,
                       help="rerank: cut each document to N tokens")
    group.add_argument("--return-documents", action="store_true", default=None,
                       help="rerank: send the documents back in ranking order")


def _options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name, None) for name in RequestOptions.__struct_fields__}


def _display_embeddings(data: dict[str, Any], result: Result) -> None:
    """Typed and packed embeddings shortened to dimension and head, decoded."""
    if not (result.embeddings_by_type or result.embeddings_packed):
        return
    try:
        arrays = decode_embeddings(result)
    except ValueError:
        return
    for key in ("embeddings_by_type", "embeddings_packed"):
        if data.get(key):
            data[key] = {t: [{"dim": int(row.shape[0]), "head": row[:8].tolist()}
                             for row in arrays[t]] for t in data[key]}


# -- the `submit` subcommand ---------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness submit``."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    parser.add_argument("--org", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--text", action="append", default=[],
                        help="a text to embed (repeat for several)")
    parser.add_argument("--query", help="rerank: the query")
    parser.add_argument("--doc", action="append", default=[],
                        help="rerank: a document (repeat for several)")
    parser.add_argument("--top-n", type=int, default=None, help="rerank: keep the best N")
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--deadline-ms", type=int, default=None)
    parser.add_argument("--id", default=None, help="request id (default: random)")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="how long to wait for the result (default 60)")
    parser.add_argument("--full", action="store_true",
                        help="print whole embedding vectors (default: dimension and first 8)")
    _add_option_arguments(parser)
    add_kafka_arguments(parser)


def _build_request(args: argparse.Namespace) -> dict[str, Any]:
    if args.text and (args.query or args.doc):
        raise ValueError("give --text (embed) or --query with --doc (rerank), not both")
    options = _options_from_args(args)
    try:
        if args.text:
            inp: dict[str, Any] = embed_input(args.text, **options)
        elif args.query is not None and args.doc:
            inp = rerank_input(args.query, args.doc, args.top_n, **options)
        else:
            raise ValueError("give --text (embed) or --query with at least one --doc (rerank)")
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid option: {e}") from None
    req: dict[str, Any] = {"org": args.org, "endpoint": args.endpoint, "input": inp,
                           "priority": args.priority}
    if args.deadline_ms is not None:
        req["deadline_ms"] = args.deadline_ms
    if args.id:
        req["id"] = args.id
    return req


def result_for_display(result: Result, *, full: bool = False) -> dict[str, Any]:
    """The result as plain JSON data; embeddings shortened to dimension and head unless ``full``."""
    data = msgspec.to_builtins(result)
    if not full and data.get("embeddings"):
        data["embeddings"] = [{"dim": len(v), "head": v[:8]} for v in data["embeddings"]]
    if not full:
        _display_embeddings(data, result)
    return data


def run(args: argparse.Namespace) -> int:
    """Send one request and print its result; exit 0 for ``ok``, 1 otherwise."""
    try:
        config = load_config(args.config)
        request = _build_request(args)
    except (ConfigError, ValueError) as e:
        print(f"serving-fairness submit: {e}", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    if settings.bootstrap is None:
        print("serving-fairness submit: give --bootstrap (or SF_BOOTSTRAP) of the cluster the "
              "pipeline runs on", file=sys.stderr)
        return 2
    return asyncio.run(_submit(settings, config, request, args.timeout_s, args.full))


async def _submit(settings: KafkaSettings, config: Config, request: dict[str, Any],
                  timeout_s: float, full: bool) -> int:
    async with FairnessClient(settings, config) as client:
        try:
            request_id = await client.submit(request)
        except msgspec.ValidationError as e:
            print(f"serving-fairness submit: invalid request: {e}", file=sys.stderr)
            return 2
        try:
            result = await client.result(request_id, timeout=timeout_s)
        except TimeoutError as e:
            print(f"serving-fairness submit: {e}", file=sys.stderr)
            return 1
    print(json.dumps(result_for_display(result, full=full), indent=2))
    return 0 if result.status == "ok" else 1
