"""Kafka client settings and the one place aiokafka clients are built.

Every service talks to Kafka through clients made here, so security, latency
tuning and the delivery defaults the design relies on (``acks="all"``, manual
commits, reading from the earliest offset) are decided once. The defaults were
measured against the embedded Tansu broker with aiokafka 0.14 (see the shared
BROKER notes) and are also sound for Apache Kafka.

Settings come from, in rising precedence: the defaults below, ``SF_*``
environment variables (:func:`settings_from_env`), and command-line flags
(:func:`add_kafka_arguments`, :func:`settings_from_args`). ``bootstrap=None``
means "no cluster given": :func:`kafka_endpoint` then starts an embedded
broker for the duration of a ``with`` block.

Not offered, on purpose: idempotent or transactional producers. Tansu rejects
aiokafka's ``InitProducerId`` request at producer start, so the pipeline is
at-least-once with idempotent results; pass ``enable_idempotence=True`` as an
override only against a real Kafka cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any, Literal, TypedDict, cast

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.group import LeaveGroupRequest
from aiokafka.structs import TopicPartition

from plumbing.bounded import within
from plumbing.broker import EmbeddedBroker
from plumbing.contiguity import Contiguity
from plumbing.fetchwatch import FetchWatch

__all__ = [
    "EMBEDDED_SESSION",
    "EMBEDDED_SESSION_ENV",
    "Consumer",
    "KafkaSettings",
    "Producer",
    "add_kafka_arguments",
    "close_clients",
    "consumer_lag",
    "group_generation",
    "in_group",
    "kafka_connected",
    "kafka_endpoint",
    "make_admin",
    "make_consumer",
    "make_producer",
    "settings_from_args",
    "settings_from_env",
    "stop_consumer",
]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"]
PositiveMs = Annotated[int, msgspec.Meta(ge=1)]
Bytes = Annotated[int, msgspec.Meta(ge=1024)]

log = structlog.get_logger("kafka")

_MiB = 1024 * 1024
# Written in place of a bootstrap address to ask for the embedded broker, so a
# flag can override an SF_BOOTSTRAP inherited from the environment.
EMBEDDED = "embedded"


class KafkaSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How every client of one process reaches and talks to Kafka.

    Fixed once built (frozen) and shared by all clients of a process; derive a
    variant with ``msgspec.structs.replace``. Unknown fields are an error so a
    misspelt setting in a file cannot silently fall back to a default.
    """

    # Where the cluster is. None starts an embedded Tansu broker (tests, demo,
    # local use); production always names its cluster.
    bootstrap: str | None = None

    # Security. Mirrors aiokafka's names so operators can map a Kafka client
    # config onto ours without guessing. SASL/PLAIN and SCRAM use the username
    # and password; GSSAPI and OAUTHBEARER need extra client arguments
    # (sasl_kerberos_service_name, sasl_oauth_token_provider) passed as
    # overrides to the factories.
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    # PEM files. The CA file verifies the brokers (the system store is used
    # when it is absent); cert and key authenticate us for mutual TLS; the
    # password unlocks an encrypted key.
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None

    # Shows up in broker logs and quotas: lets an operator tell our services
    # apart from other tenants of a shared cluster.
    client_id: str = "serving-fairness"

    # "all": a write is acknowledged only once every in-sync replica has it.
    # The design promises no request is ever lost; acks=1 (aiokafka's
    # default) loses acknowledged records when a leader fails over.
    acks: Literal[0, 1, "all"] = "all"
    # Producer waits this long to fill a batch: still batches under load (0
    # sends a request per message). With fetch_max_wait_ms below, on Tansu at
    # 2000 msg/s of 200 B (bench/broker_latency.py): produce->consume p50 ~8 ms,
    # p99 ~16 ms, against ~104 / ~270 ms with aiokafka's defaults.
    linger_ms: Annotated[int, msgspec.Meta(ge=0)] = 5
    # Per-partition batch ceiling. 4 KB messages need 256 KB-1 MB batches: the
    # 16 KB default gave 5k msg/s instead of 17-22k on Tansu.
    max_batch_size: Bytes = 1 * _MiB
    # How long a produce may take, retries of retriable errors included, before
    # it fails and the service's own retry takes over (aiokafka's default is
    # 40 s: a batch whose partition had lost its leader in the producer's
    # metadata stalled a whole admission step that long, see Producer).
    # Producers only: a consumer's JoinGroup
    # may legitimately wait longer than this on a real cluster.
    produce_timeout_ms: PositiveMs = 5000
    # Pause between retries of a failed produce (aiokafka's default).
    retry_backoff_ms: PositiveMs = 100
    # Largest produce request. Batches of many long texts exceed the 1 MB
    # default; 10 MB worked on Tansu. A real cluster must raise
    # message.max.bytes (broker/topic) to match, or it rejects such records.
    max_request_size: Bytes = 10 * _MiB
    # How long the broker may hold a fetch with no data. Tansu sleeps this long
    # before answering, so it bounds consume latency: 10 ms instead of the
    # 500 ms default. 1 ms made the consumer fall behind at 2000 msg/s.
    fetch_max_wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 10
    # The same for consumers that follow slowly changing state, off every
    # request's path: the scheduler's state snapshots (published every
    # state_interval_ms, 250 by default); the leader partition is read with
    # the smaller of this and a twentieth of the leader silence, since a beat
    # read late delays a takeover (scheduler/leader.py). A consumer with nothing to read sends a fetch every wait: at
    # 10 ms one idle consumer took 6-8 % of a core on the 2-core machine,
    # at 100 ms about 1 % (docs/benchmarks.md, "What an idle pipeline
    # costs"; bench/investigations/idle_cost.py for the whole pipeline), and the broker
    # serves each.
    # A record already there is answered at once either way.
    follow_fetch_max_wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 200
    # The same for a consumer while it knows nothing is due to it: a client
    # with no request in flight (producer.client.FairnessClient). An idle
    # consumer at 10 ms cost the embedded broker 7-9 % of a core and itself
    # as much; at 50 ms about 2 % each (docs/benchmarks.md, "An idle
    # client"). But the embedded broker holds an empty fetch for its whole
    # wait, even when the result comes meanwhile: at 50 ms the quiet orgs of
    # bench/isolation.py got their results 7-10 ms later at p50 and 14-21 ms
    # at p99 ("delivery"). So the default is the busy wait; on a Kafka
    # cluster, which answers as soon as data is there, it can be raised
    # for free (docs/deployment.md).
    idle_fetch_max_wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 10
    # The longest aiokafka's background fetcher sleeps before it looks again
    # for a partition to fetch (its consumer_timeout_ms, 200 by default). In
    # the CPU demo a batch sometimes reached its worker 175-205 ms after the
    # scheduler wrote it (5-55 of 504 batches a run, the usual time 2-7 ms):
    # at 20, none took over 20 ms (the runs: git show f1ddd8c:docs/demo.md). A wake-up with nothing to
    # do costs the consumer a few microseconds, no request.
    consumer_timeout_ms: PositiveMs = 20
    # Group membership. 6 s is the lowest session Apache Kafka accepts by
    # default (group.min.session.timeout.ms) and halves Tansu's group join,
    # which it holds for session_timeout_ms / 2 (5 s at aiokafka's 10 s). A
    # dead worker's partitions move after about this long. Tests on Tansu use
    # 2 s; a real cluster rejects values below its minimum.
    session_timeout_ms: PositiveMs = 6000
    # A third of the session or less, as Kafka recommends, so one late
    # heartbeat never expires a live member.
    heartbeat_interval_ms: PositiveMs = 1500

    def __post_init__(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        if not sasl and (self.sasl_plain_username or self.sasl_plain_password):
            raise ValueError(
                f"SASL credentials given but security_protocol={self.security_protocol}; "
                "use SASL_SSL or SASL_PLAINTEXT, or drop the credentials"
            )
        needs_password = self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        if sasl and needs_password and not (self.sasl_plain_username and self.sasl_plain_password):
            raise ValueError(f"SASL {self.sasl_mechanism} needs a username and a password")
        tls_files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile, self.ssl_password)
        if not tls and any(tls_files):
            raise ValueError(
                f"TLS files given but security_protocol={self.security_protocol}; "
                "use SSL or SASL_SSL, or drop the files"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")

    def __repr__(self) -> str:
        # Settings end up in logs and tracebacks; secrets must not.
        shown = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("sasl_plain_password", "ssl_password") and value is not None:
                value = "***"
            shown.append(f"{name}={value!r}")
        return f"KafkaSettings({', '.join(shown)})"

    def require_bootstrap(self) -> str:
        """The cluster address, or a clear error when none was resolved yet."""
        if self.bootstrap is None:
            raise ValueError(
                "KafkaSettings.bootstrap is None: resolve it first with "
                "`async with kafka_endpoint(settings) as bootstrap`"
            )
        return self.bootstrap


# -- clients -------------------------------------------------------------------


class Producer(AIOKafkaProducer):
    """aiokafka's producer, with every topic it writes to kept in its metadata.

    aiokafka refreshes metadata only for the topics ``client.add_topic`` was
    called for, and its ``send``/``send_batch`` call it only for a topic its
    metadata does not know yet. Its bootstrap metadata knows every topic, so
    a topic that existed when the producer started is written to untracked;
    the first write to a topic created since (a reply topic) then narrows
    the refresh to the tracked topics, and the untracked one loses its
    partition leaders. A batch already handed over for it waits for a
    leader until the produce timeout and fails with aiokafka's own
    ``NotLeaderForPartitionError`` (the broker answered every request). In
    two of five runs of ``bench/overload.py`` admission's tier writes stalled
    that way for 4-5 s when its first refusal's reply topic was new to its
    producer (with ``SF_LOG_LEVEL_AIOKAFKA=debug``: ~600 metadata refreshes a
    second naming only the reply topic; ``tests/integration/test_broker.py``
    shows the lost leaders).
    Tracking each topic on its first write keeps it in every refresh.
    """

    def _track(self, topic: str) -> None:
        if topic not in self.client._topics:  # aiokafka offers no public test for it
            self.client.add_topic(topic)

    async def send(self, topic, *args, **kwargs):
        self._track(topic)
        return await super().send(topic, *args, **kwargs)

    async def send_batch(self, batch, topic, *, partition):
        self._track(topic)
        return await super().send_batch(batch, topic, partition=partition)

    async def partitions_for(self, topic):
        self._track(topic)
        return await super().partitions_for(topic)


class Consumer(AIOKafkaConsumer):
    """aiokafka's consumer, never moving past offsets the broker has not made readable yet.

    aiokafka takes records beyond its position as compaction and moves on.
    Tansu answers a fetch that way while a concurrent produce has reserved
    offsets it has not stored (:mod:`plumbing.contiguity`), and those
    records would never be read. ``getmany`` therefore hands on each
    partition's records only up to the first jump, seeks back to it and
    fetches again within the same call's timeout; a jump still there after
    ``gap_grace_s`` is a real gap and goes through with one
    ``offset_gap_skipped`` warning naming it.

    It also says when it is stuck: a partition behind its high watermark
    whose fetches all come back empty for ``stall_after_s`` gets one
    ``fetch_stalled`` warning (and ``fetch_resumed`` when records come), as
    on the embedded broker once a partition is too long to list in a
    fetch's wait (:mod:`plumbing.fetchwatch`).

    And a partition's unread records never hold back a fetch of the others.
    aiokafka sends a broker no fetch at all while any of its partitions has
    records fetched less than ``prefetch_backoff`` ago (100 ms, not a setting
    of ``AIOKafkaConsumer``) and not yet handed out. A consumer that reads in
    slices (the scheduler's intake, 500 records a call) then left a record
    on a quiet partition unfetched for up to that long behind a burst's
    buffered records on another. ``prefetch_backoff_s`` replaces it (0 by
    default): a partition with unread records is still not fetched again (the
    buffer stays at one fetch per partition); the others are fetched at once.
    """

    def __init__(self, *topics: str, gap_grace_s: float = 0.5, stall_after_s: float = 10.0,
                 prefetch_backoff_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*topics, **kwargs)
        self.prefetch_backoff_s = prefetch_backoff_s
        self._contiguity = Contiguity(gap_grace_s)
        self._watch = FetchWatch(stall_after_s)
        self.gaps_refetched = 0
        self.gaps_skipped = 0
        self.stalls = 0
        self._wait_unset_logged = False

    async def start(self) -> None:
        await super().start()
        # aiokafka 0.14 internals, read defensively: without them the
        # consumer works as aiokafka's own, and says so once.
        fetcher = getattr(self, "_fetcher", None)
        if fetcher is not None and isinstance(getattr(fetcher, "_prefetch_backoff", None),
                                              int | float):
            fetcher._prefetch_backoff = self.prefetch_backoff_s
        else:
            log.warning("prefetch_backoff_unset", prefetch_backoff_s=self.prefetch_backoff_s,
                        detail="aiokafka's fetcher has no _prefetch_backoff: a partition's "
                               "unread records may hold back fetches of the others")

    @property
    def fetch_wait_ms(self) -> int | None:
        """How long the broker may hold this consumer's next fetch with no data (ms)."""
        fetcher = getattr(self, "_fetcher", None)
        wait = getattr(fetcher, "_fetch_max_wait_ms", None)
        return wait if isinstance(wait, int) else None

    def set_fetch_wait(self, ms: int) -> bool:
        """Let the broker hold this consumer's fetches up to ``ms`` from the next one on.

        The fetch in progress keeps its wait. False (and one warning) when
        aiokafka's fetcher has no such setting (aiokafka 0.14 internals, read
        defensively): the consumer then keeps the wait it was made with.
        """
        if self.fetch_wait_ms is None:
            if not self._wait_unset_logged:
                self._wait_unset_logged = True
                log.warning("fetch_wait_unset", fetch_wait_ms=ms,
                            detail="aiokafka's fetcher has no _fetch_max_wait_ms (or the "
                                   "consumer is not started): the fetch wait stays as made")
            return False
        self._fetcher._fetch_max_wait_ms = ms
        return True

    def _assignment(self):
        subscription = self._subscription.subscription
        return None if subscription is None else subscription.assignment

    def _positions(self) -> dict[Any, int]:
        # aiokafka offers ``position()`` only as a coroutine that may fetch.
        assignment = self._assignment()
        if assignment is None:
            return {}
        positions = {}
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                positions[tp] = state.position
        return positions

    def positions_now(self) -> dict[Any, int]:
        """Each assigned partition's position where one is known, without fetching."""
        return self._positions()

    def caught_up(self) -> bool:
        """True when every assigned partition has a position and a high watermark (from a
        fetch answer) and the position has reached it: all that was there has been read."""
        assignment = self._assignment()
        if assignment is None:
            return False
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is None or not state.has_valid_position or state.highwater is None:
                return False
            if state.position < state.highwater:
                return False
        return True

    async def getmany(self, *partitions, timeout_ms: int = 0, max_records: int | None = None):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            before = self._positions()
            got = await super().getmany(*partitions, timeout_ms=max(
                0, int((deadline - loop.time()) * 1000)), max_records=max_records)
            now = loop.time()
            self._watch_fetch(got, partitions, now)
            kept, held = {}, False
            for tp, records in got.items():
                cut = self._contiguity.cut(tp, before.get(tp), records, now)
                for gap in cut.skipped:
                    self.gaps_skipped += 1
                    log.warning("offset_gap_skipped", topic=tp.topic, partition=tp.partition,
                                 start=gap.start, end=gap.end, waited_s=round(gap.waited_s, 3),
                                 detail="offsets never became readable; passed over")
                if cut.refetch_from is not None:
                    held = True
                    self.gaps_refetched += 1
                    log.info("offset_gap_refetched", topic=tp.topic, partition=tp.partition,
                              at=cut.refetch_from, next_offset=records[len(cut.kept)].offset,
                              detail="the broker answered past records not yet readable")
                    self.seek(tp, cut.refetch_from)
                if cut.kept:
                    kept[tp] = list(cut.kept)
            if kept or not held or loop.time() >= deadline:
                return kept
            await asyncio.sleep(0.005)

    def _watch_fetch(self, got: Mapping, asked: tuple, now: float) -> None:
        """Tell the fetch watch which partitions were behind and got nothing."""
        assignment = self._assignment()
        if assignment is None:
            return
        starved: list[TopicPartition] = []
        fed: list[TopicPartition] = []
        for tp in asked or assignment.tps:
            state = assignment.state_value(tp)
            if state is None:
                continue
            if state.paused:
                self._watch.forget(tp)
            elif tp in got:
                fed.append(tp)
            elif state.highwater is not None and state.has_valid_position:
                (starved if state.position < state.highwater else fed).append(tp)
        began, ended = self._watch.observe(starved, fed, now)
        for stall in began:
            self.stalls += 1
            # The watch hands back the partitions given to it (a Stall's tp is any Hashable).
            tp = cast(TopicPartition, stall.tp)
            state = assignment.state_value(tp)
            log.warning("fetch_stalled", topic=tp.topic, partition=tp.partition,
                        position=state.position, highwater=state.highwater,
                        seconds=round(stall.seconds, 1),
                        detail="behind the partition's end and every fetch comes back empty: "
                               "a broker that cannot list the partition within the fetch wait "
                               "(the embedded broker's memory store, a partition of ~10,000+ "
                               "batches) or one that serves no data")
        for stall in ended:
            tp = cast(TopicPartition, stall.tp)
            log.info("fetch_resumed", topic=tp.topic, partition=tp.partition,
                     seconds=round(stall.seconds, 1))


def make_producer(settings: KafkaSettings, **overrides: Any) -> Producer:
    """A producer with our delivery and latency defaults; call inside a coroutine."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.require_bootstrap(),
        "client_id": settings.client_id,
        "acks": settings.acks,
        "linger_ms": settings.linger_ms,
        "max_batch_size": settings.max_batch_size,
        "max_request_size": settings.max_request_size,
        "request_timeout_ms": settings.produce_timeout_ms,
        "retry_backoff_ms": settings.retry_backoff_ms,
        **_security_kwargs(settings),
    }
    return Producer(**(kwargs | overrides))


def make_consumer(
    settings: KafkaSettings, *topics: str, group_id: str | None = None, follower: bool = False,
    **overrides: Any
) -> Consumer:
    """A consumer that commits only when told to and starts from the earliest offset.

    ``follower``: it follows slowly changing state, off every request's path,
    and waits ``follow_fetch_max_wait_ms`` on an idle fetch, not
    ``fetch_max_wait_ms``.

    Manual commits because every service holds work in memory: an offset is
    committed once its records are done, so a crash replays instead of losing.
    ``earliest`` because a new group must see records written before it
    joined (and Tansu gets ``latest`` wrong anyway).
    """
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.require_bootstrap(),
        "client_id": settings.client_id,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": (settings.follow_fetch_max_wait_ms if follower
                              else settings.fetch_max_wait_ms),
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
        "consumer_timeout_ms": settings.consumer_timeout_ms,
        **_security_kwargs(settings),
    }
    return Consumer(*topics, **(kwargs | overrides))


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop a consumer so that its group rebalances at once, on Tansu too.

    Tansu numbers a group's first generation 0 and aiokafka sends LeaveGroup
    only from generation 1 on, so a member stopping in the first generation
    looked dead: the next member waited out the session (about 4 s instead
    of 1 s at a 2 s session). Leave explicitly in that case, then stop.
    Apache Kafka starts at generation 1, where this adds nothing.
    """
    # Private attributes of aiokafka 0.14, read defensively: if they move,
    # this degrades to a plain stop().
    coordinator = getattr(consumer, "_coordinator", None)
    member_id = getattr(coordinator, "member_id", None)
    if coordinator is not None and getattr(coordinator, "generation", None) == 0 and member_id:
        with contextlib.suppress(KafkaError, AttributeError, OSError):
            await coordinator._send_req(LeaveGroupRequest(coordinator.group_id, member_id))
    await consumer.stop()


async def close_clients(*clients) -> None:
    """Stop every client given (None skipped), consumers leaving their group at once.

    A client that fails to stop must not keep the others open: each is
    stopped whatever the one before did.
    """
    for client in clients:
        if client is None:
            continue
        with contextlib.suppress(Exception):
            if isinstance(client, AIOKafkaConsumer):
                await stop_consumer(client)
            else:
                await client.stop()


async def consumer_lag(consumer: AIOKafkaConsumer, partitions, *,
                       timeout_s: float = 0.5) -> dict[Any, int]:
    """Records of each partition not yet handed to the caller: ``highwater - position``.

    The high watermark comes with each fetch response (``end_offsets()`` is
    wrong on Tansu); the position is the next offset ``getmany`` will return,
    so records fetched but still buffered count as lag. A partition with no
    fetch response yet, or no position within ``timeout_s`` (just assigned,
    its committed offset not fetched yet), is left out rather than guessed.
    Positions are asked for together, so one call waits ``timeout_s`` at most.
    A paused partition's high watermark is as old as its last fetch.
    """
    highs = {tp: high for tp in partitions if (high := consumer.highwater(tp)) is not None}

    async def position(tp) -> int | None:
        try:
            return await within(consumer.position(tp), timeout_s)
        except (KafkaError, TimeoutError):  # not assigned any more, or no position yet
            return None

    positions = await asyncio.gather(*(position(tp) for tp in highs))
    return {tp: max(0, high - pos)
            for (tp, high), pos in zip(highs.items(), positions, strict=True)
            if pos is not None}


def group_generation(consumer: AIOKafkaConsumer) -> tuple[int, str] | None:
    """(generation, member id) of a group consumer now; None if aiokafka hides them."""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", None)
    member_id = getattr(coordinator, "member_id", None)
    if not isinstance(generation, int) or not isinstance(member_id, str):
        return None
    return generation, member_id


def in_group(consumer: AIOKafkaConsumer, since: tuple[int, str] | None = None) -> bool:
    """True while a group consumer is a member of its group's current generation.

    Commit only then. A member the coordinator no longer knows (expelled,
    or the broker lost the group: a Tansu restart) is reset by aiokafka to
    generation -1, and a commit with generation -1 is taken as a commit
    from outside any group: it would write offsets read before, possibly
    from a topic since recreated, over the group's, and the next owner
    would skip that many new records. With ``since`` (the
    :func:`group_generation` when the records were fetched), also False once
    the member rejoined: offsets read before a rejoin are not the new
    generation's to commit. Unknown internals count as a member.
    """
    now = group_generation(consumer)
    if now is None:
        return True
    generation, member_id = now
    if generation < 0 or member_id == "":
        return False
    return since is None or since == now


def make_admin(settings: KafkaSettings, **overrides: Any) -> AIOKafkaAdminClient:
    """An admin client (topic management); call inside a coroutine."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.require_bootstrap(),
        "client_id": settings.client_id,
        **_security_kwargs(settings),
    }
    return AIOKafkaAdminClient(**(kwargs | overrides))


def _security_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol.endswith("SSL"):
        kwargs["ssl_context"] = _ssl_context(settings)
    if settings.security_protocol.startswith("SASL_"):
        kwargs["sasl_mechanism"] = settings.sasl_mechanism
        kwargs["sasl_plain_username"] = settings.sasl_plain_username
        kwargs["sasl_plain_password"] = settings.sasl_plain_password
    return kwargs


def _ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    if settings.ssl_cafile is None:
        # aiokafka's helper starts from an empty trust store; without a CA
        # file the operating system's store is what verifies the brokers.
        context = ssl.create_default_context()
        if settings.ssl_certfile:
            context.load_cert_chain(
                settings.ssl_certfile, settings.ssl_keyfile, settings.ssl_password
            )
        return context
    return create_ssl_context(
        cafile=settings.ssl_cafile,
        certfile=settings.ssl_certfile,
        keyfile=settings.ssl_keyfile,
        password=settings.ssl_password,
    )


@contextlib.asynccontextmanager
async def kafka_endpoint(settings: KafkaSettings) -> AsyncIterator[str]:
    """Yield a bootstrap address: the configured one, or an embedded broker's.

    The embedded broker lives exactly as long as the block; use
    ``msgspec.structs.replace(settings, bootstrap=bootstrap)`` inside it.
    """
    if settings.bootstrap is not None:
        yield settings.bootstrap
        return
    if settings.security_protocol != "PLAINTEXT":
        raise ValueError(
            f"the embedded broker speaks PLAINTEXT only, not {settings.security_protocol}; "
            "give --bootstrap to use a secured cluster"
        )
    async with EmbeddedBroker() as broker:
        yield broker.bootstrap


class _GroupSession(TypedDict):
    session_timeout_ms: int
    heartbeat_interval_ms: int


#: Group sessions on an embedded broker: it holds a group join for half the
#: session (``shared/BROKER.md``), so a short one makes a join take ~1 s, not 3.
EMBEDDED_SESSION: _GroupSession = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
#: The same for a service started as a process of its own (its environment).
EMBEDDED_SESSION_ENV = {f"SF_KAFKA_{k.upper()}": str(v) for k, v in EMBEDDED_SESSION.items()}


@contextlib.asynccontextmanager
async def kafka_connected(settings: KafkaSettings) -> AsyncIterator[KafkaSettings]:
    """``settings`` with a bootstrap: the configured one as it is, or an embedded
    broker's (:func:`kafka_endpoint`) with short group sessions (:data:`EMBEDDED_SESSION`).
    """
    async with kafka_endpoint(settings) as bootstrap:
        if settings.bootstrap is None:
            settings = msgspec.structs.replace(settings, bootstrap=bootstrap, **EMBEDDED_SESSION)
        yield settings


# -- environment and command line -------------------------------------------


class _Option(msgspec.Struct, frozen=True):
    field: str
    flag: str
    env: str
    help: str
    secret: bool = False


# Connection options use the short names operators expect; tuning options
# carry a --kafka- prefix so they never collide with a service's own flags
# (the scheduler has batch sizes of its own).
_OPTIONS = (
    _Option("bootstrap", "--bootstrap", "SF_BOOTSTRAP",
            f"Kafka bootstrap servers host:port[,...]; '{EMBEDDED}' or unset starts "
            "an embedded broker"),
    _Option("security_protocol", "--security-protocol", "SF_SECURITY_PROTOCOL",
            "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    _Option("sasl_mechanism", "--sasl-mechanism", "SF_SASL_MECHANISM",
            "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI or OAUTHBEARER"),
    _Option("sasl_plain_username", "--sasl-username", "SF_SASL_USERNAME", "SASL username"),
    _Option("sasl_plain_password", "--sasl-password", "SF_SASL_PASSWORD",
            "SASL password (prefer the environment variable: flags show in `ps`)", True),
    _Option("ssl_cafile", "--ssl-cafile", "SF_SSL_CAFILE",
            "PEM CA bundle that verifies the brokers (default: system store)"),
    _Option("ssl_certfile", "--ssl-certfile", "SF_SSL_CERTFILE",
            "PEM client certificate, for mutual TLS"),
    _Option("ssl_keyfile", "--ssl-keyfile", "SF_SSL_KEYFILE", "PEM client private key"),
    _Option("ssl_password", "--ssl-password", "SF_SSL_PASSWORD",
            "password of an encrypted client key (prefer the environment variable)", True),
    _Option("client_id", "--kafka-client-id", "SF_KAFKA_CLIENT_ID",
            "client id shown in broker logs and quotas"),
    _Option("acks", "--kafka-acks", "SF_KAFKA_ACKS", "producer acks: 0, 1 or all"),
    _Option("linger_ms", "--kafka-linger-ms", "SF_KAFKA_LINGER_MS",
            "producer batching delay (ms)"),
    _Option("max_batch_size", "--kafka-max-batch-size", "SF_KAFKA_MAX_BATCH_SIZE",
            "producer batch size per partition (bytes)"),
    _Option("max_request_size", "--kafka-max-request-size", "SF_KAFKA_MAX_REQUEST_SIZE",
            "largest produce request (bytes)"),
    _Option("produce_timeout_ms", "--kafka-produce-timeout-ms", "SF_KAFKA_PRODUCE_TIMEOUT_MS",
            "longest a produce may take, retries included, before it fails (ms)"),
    _Option("retry_backoff_ms", "--kafka-retry-backoff-ms", "SF_KAFKA_RETRY_BACKOFF_MS",
            "pause between retries of a failed produce (ms)"),
    _Option("fetch_max_wait_ms", "--kafka-fetch-max-wait-ms", "SF_KAFKA_FETCH_MAX_WAIT_MS",
            "longest a fetch waits for data (ms); bounds consume latency"),
    _Option("follow_fetch_max_wait_ms", "--kafka-follow-fetch-max-wait-ms",
            "SF_KAFKA_FOLLOW_FETCH_MAX_WAIT_MS",
            "the same for consumers of slowly changing state (scheduler state, "
            "leadership claims), off every request's path (ms)"),
    _Option("idle_fetch_max_wait_ms", "--kafka-idle-fetch-max-wait-ms",
            "SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS",
            "the same for a client with no request in flight (ms)"),
    _Option("consumer_timeout_ms", "--kafka-consumer-timeout-ms",
            "SF_KAFKA_CONSUMER_TIMEOUT_MS",
            "longest a consumer's background fetcher sleeps before it looks for a "
            "partition to fetch again (ms)"),
    _Option("session_timeout_ms", "--kafka-session-timeout-ms", "SF_KAFKA_SESSION_TIMEOUT_MS",
            "consumer group session (ms); a dead member is noticed after it"),
    _Option("heartbeat_interval_ms", "--kafka-heartbeat-interval-ms",
            "SF_KAFKA_HEARTBEAT_INTERVAL_MS", "consumer heartbeat interval (ms)"),
)  # fmt: skip


def settings_from_env(
    env: Mapping[str, str] | None = None, *, base: KafkaSettings | None = None
) -> KafkaSettings:
    """Settings from ``SF_*`` variables over ``base`` (default: the defaults).

    Empty variables count as unset. Raises ``msgspec.ValidationError`` naming
    the field for a malformed value.
    """
    env = os.environ if env is None else env
    values = {o.field: env[o.env] for o in _OPTIONS if env.get(o.env, "") != ""}
    return _merge(base or KafkaSettings(), values)


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the Kafka flags (one group) to a subcommand's parser.

    Every flag defaults to "not given" so that :func:`settings_from_args` can
    layer flags over the environment. Help texts name the variable.
    """
    group = parser.add_argument_group("Kafka", "flags override the SF_* environment")
    for o in _OPTIONS:
        shown = "***" if o.secret else None
        group.add_argument(
            o.flag,
            dest=f"kafka_{o.field}",
            default=None,
            metavar=shown or o.field.split("_")[-1].upper(),
            help=f"{o.help} [env {o.env}]",
        )


def settings_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> KafkaSettings:
    """Settings from parsed flags over the environment over the defaults."""
    base = settings_from_env(env)
    values = {
        o.field: value
        for o in _OPTIONS
        if (value := getattr(args, f"kafka_{o.field}", None)) is not None
    }
    return _merge(base, values)


def _merge(base: KafkaSettings, values: Mapping[str, str]) -> KafkaSettings:
    merged: dict[str, Any] = msgspec.structs.asdict(base)
    for name, raw in values.items():
        merged[name] = _parse(name, raw)
    # strict=False turns "5" into 5 and checks every constraint, so a bad
    # value fails here with the field's name instead of deep inside aiokafka.
    return msgspec.convert(merged, KafkaSettings, strict=False)


def _parse(name: str, raw: str) -> Any:
    if name == "bootstrap":
        raw = raw.strip()
        return None if raw.lower() in ("", EMBEDDED) else raw
    if name == "acks":
        raw = raw.strip()
        return int(raw) if raw in ("0", "1") else raw
    return raw
