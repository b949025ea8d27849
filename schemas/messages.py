"""Wire messages: everything that travels on a topic.

Every message is a msgspec Struct derived from :class:`Message`. The rules of
schema evolution (msgspec ``docs/schema-evolution.rst``) hold for all of them:

* a new field always gets a default, so old producers stay valid;
* a field never changes its type;
* unknown fields are skipped, so old consumers read new messages.

Limits live in the types (``Annotated[..., Meta(...)]``) so a decoder rejects a
bad value with a message naming the field, before any service logic runs.
Size limits that depend on configuration (texts per request, characters per
text) are checked by admission, which knows the endpoint.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from schemas.options import (
    Dimensions,
    EmbeddingTypes,
    Encoding,
    MaxTokensPerDoc,
    PromptName,
    PromptText,
    Truncate,
)

__all__ = [
    "TERMINAL_STATUSES",
    "AdmittedPack",
    "AdmittedRequest",
    "Batch",
    "BatchTiming",
    "CostState",
    "DeadLetter",
    "EmbedInput",
    "FeedbackMark",
    "Input",
    "Int64",
    "LaneState",
    "LeaderClaim",
    "Message",
    "OrgId",
    "Request",
    "RequestId",
    "RerankInput",
    "Result",
    "ResultPack",
    "SchedulerState",
    "Status",
    "WorkerEvent",
]

#: Identifiers are short printable tokens: they end up in keys, logs and
#: (for orgs, when allow-listed) metric labels. Patterns end in ``\Z``, not ``$``:
#: msgspec searches with Python's ``re``, where ``$`` also matches before a
#: trailing newline, so "sf.replies.x\n" would pass as a topic name.
RequestId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+\Z")]
OrgId = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._\-]+\Z")]
EndpointName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._\-]+\Z")]
TopicName = Annotated[str, Meta(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._\-]+\Z")]
Priority = Annotated[int, Meta(ge=0, le=100)]
#: Every other integer fits in 64 bits: JSON decodes integers of any size, but
#: msgpack cannot encode one beyond 64 bits and a float cannot hold one beyond
#: ~1.8e308, so a bigger one would fail later, far from its record.
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
#: Epoch milliseconds. Bounded so that arithmetic on them never overflows a
#: float's exact integer range and a nonsense year is an error.
EpochMs = Annotated[int, Meta(ge=0, le=10**14)]
DurationMs = Annotated[int, Meta(ge=1, le=86_400_000)]


class Message(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Base of every wire message: keyword-only, defaults left off the wire.

    Not tracked by the garbage collector (``gc=False``): a message is a tree of
    values and never part of a reference cycle, and the scheduler holds tens of
    thousands of them (the collector's passes over them cost it ~10 % of its CPU
    under a burst, ``docs/benchmarks.md``). Never store a message in itself.
    """


class EmbedInput(Message, kw_only=True, tag="embed"):
    """Texts to embed; one vector per text comes back, in order.

    The options (all optional, defaults as before they existed) are
    described in :mod:`schemas.options`. ``prompt`` is set by admission
    alone, from ``input_type``/``prompt_name`` and the endpoint's prompts.
    """

    #: A tuple, not a list: a tuple of strings is not tracked by the garbage
    #: collector once a collection has seen it, so the requests a scheduler
    #: holds add nothing to a full collection's walk (``Message``).
    texts: Annotated[tuple[str, ...], Meta(min_length=1)]
    input_type: PromptName | None = None
    prompt_name: PromptName | None = None
    truncate: Truncate = "end"
    normalize: bool | None = None
    dimensions: Dimensions | None = None
    embedding_types: EmbeddingTypes | None = None
    encoding: Encoding = "float"
    prompt: PromptText | None = None

    def __post_init__(self) -> None:
        # A caller that builds one by hand with a list gets the tuple a decoder makes.
        if type(self.texts) is not tuple:
            self.texts = tuple(self.texts)


class RerankInput(Message, kw_only=True, tag="rerank"):
    """A query and the documents to score against it; one score per document."""

    query: str
    documents: Annotated[tuple[str, ...], Meta(min_length=1)]  # a tuple: as ``EmbedInput.texts``
    top_n: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None
    #: Options (:mod:`schemas.options`): cut each document to this many tokens,
    #: send the documents back with the ranking, which end to truncate.
    max_tokens_per_doc: MaxTokensPerDoc | None = None
    return_documents: bool = False
    truncate: Truncate = "end"

    def __post_init__(self) -> None:
        if type(self.documents) is not tuple:  # as EmbedInput's texts
            self.documents = tuple(self.documents)


Input = EmbedInput | RerankInput


class Request(Message, kw_only=True):
    """What an upstream service sends to the ingress topic.

    ``deadline_ms`` counts from ``created_ms`` (the sender's clock) or, when
    that is absent, from the Kafka record's timestamp. ``reply_to`` must lie
    under the allowed reply prefix; without it the result goes to the shared
    results topic.

    ``tier`` and ``weight`` exist only so that a request claiming them can be
    refused with a clear error: both come from the tenant registry alone.
    """

    id: RequestId
    org: OrgId
    endpoint: EndpointName
    input: Input
    priority: Priority = 0
    deadline_ms: DurationMs | None = None
    created_ms: EpochMs | None = None
    reply_to: TopicName | None = None
    #: Ask for results several to a record (a ``ResultPack``, ``docs/protocol.md``)
    #: on ``reply_to``: for a reader that reads its own reply topic and decodes packs.
    reply_packed: bool = False
    tier: str | None = None
    weight: float | None = None


class AdmittedRequest(Message, kw_only=True):
    """A request that passed admission, on ``requests.<tier>`` keyed by org.

    Everything the scheduler and the worker need is resolved here, once:
    the tier from the registry, the token count from the endpoint's
    tokenizer, the absolute deadline, and the reply topic.
    """

    id: RequestId
    org: OrgId
    endpoint: EndpointName
    tier: str
    input: Input
    tokens: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    priority: Priority = 0
    deadline_at_ms: EpochMs | None = None
    created_ms: EpochMs
    admitted_ms: EpochMs
    reply_to: TopicName
    #: ``json`` or ``msgpack``: results go back in the encoding the request came in.
    reply_format: Literal["json", "msgpack"] = "json"
    #: The sender asked for its results packed (``Request.reply_packed``).
    reply_packed: bool = False
    #: When admission read it off the ingress topic (``admitted_ms`` is when it
    #: decided), and when the scheduler read it off its tier topic: stamps of
    #: where a request's time goes, carried into its result.
    fetched_ms: EpochMs | None = None
    received_ms: EpochMs | None = None


class AdmittedPack(Message, kw_only=True):
    """Several admitted requests of one org in one record of ``requests.<tier>``.

    The record carries the header ``sf-pack: 1`` (:mod:`schemas.packs`); a
    record without it holds one ``AdmittedRequest``, and the scheduler reads
    both. Order is the order admission decided them in.
    """

    requests: Annotated[list[AdmittedRequest], Meta(min_length=1)]


class Batch(Message, kw_only=True):
    """Requests the scheduler chose, in its order, for one worker slot.

    ``requests`` keeps the order of selection: a worker that publishes
    results per micro-batch serves the first-chosen requests first.
    """

    id: str
    endpoint: EndpointName
    requests: list[AdmittedRequest]
    tokens: Int64
    created_ms: EpochMs
    #: The worker whose free slot this batch fills (its member id).
    worker: str = ""
    #: Leadership epoch of the scheduler that emitted it (failover fencing).
    epoch: Int64 = 0
    #: The scheduler's estimate of the round trip to this worker (its report
    #: out, the next batch back; ms), None until measured: the worker returns
    #: the batch's credit about this long (+ 5 ms) before the batch's
    #: expected end (:mod:`worker.credit_return`).
    round_trip_ms: float | None = None
    #: Sent beyond the worker's credit because an org with nothing held came
    #: in after the batch queued at the worker had gone out
    #: (:mod:`scheduler.dispatch`): the worker runs its minority head next,
    #: ahead of the batches it already holds (:mod:`worker.execute`).
    express: bool = False
    #: A new leader's mark, written to every partition of every batch topic
    #: before it dispatches (no requests): a worker takes it as the newest
    #: epoch of that partition and refuses any older epoch's batch behind it
    #: (:mod:`scheduler.takeover`). A worker older than the field serves it
    #: as an empty batch.
    fence: bool = False


Status = Literal["ok", "rejected", "expired", "invalid", "failed"]
TERMINAL_STATUSES: tuple[str, ...] = ("ok", "rejected", "expired", "invalid", "failed")


class Result(Message, kw_only=True):
    """The one terminal answer to a request.

    ``reason`` is a stable machine-readable code (``rate_limited``,
    ``throttled``, ``overloaded``, ``deadline_passed``, ``decode_error``...),
    ``message`` says the same to a person. For ``ok`` embed results
    ``embeddings`` holds one vector per text; for rerank, ``scores`` holds one
    score per document in the order sent and ``ranking`` the document indices
    best first (cut to ``top_n``). ``truncated`` flags inputs longer than the
    model's maximum length, which the model cut.
    """

    id: str
    status: Status
    org: str = ""
    endpoint: str = ""
    reason: str | None = None
    message: str | None = None
    retry_after_ms: Int64 | None = None
    embeddings: list[list[float]] | None = None
    scores: list[float] | None = None
    ranking: list[Int64] | None = None
    #: ``cross-encoder`` or ``cosine``: how rerank scores were computed.
    method: str | None = None
    model: str | None = None
    truncated: list[bool] | None = None
    # -- embedding and rerank options (schemas.options, schemas.vectors) --
    #: Values per vector after ``dimensions`` (binary types pack them 8 to a byte).
    dimensions: Int64 | None = None
    #: ``int8``/``uint8``/``binary``/``ubinary`` vectors as numbers, by type
    #: (``embeddings`` keeps the float ones), when ``encoding`` is ``float``.
    embeddings_by_type: dict[str, list[list[Int64]]] | None = None
    #: Every requested type as one little-endian byte string per vector, when
    #: ``encoding`` is ``base64``: base64 text in JSON, a binary in msgpack.
    embeddings_packed: dict[str, list[bytes]] | None = None
    #: Rerank with ``return_documents``: the documents, in ``ranking``'s order.
    documents: list[str] | None = None
    tokens: Int64 | None = None
    batch_id: str | None = None
    worker: str | None = None
    created_ms: Int64 | None = None
    #: Where the time went, epoch ms of each step (``docs/protocol.md``):
    #: sent (``created_ms``), read by admission (``fetched_ms``), admitted
    #: (``admitted_ms``), read by the scheduler (``received_ms``), sent in a
    #: batch (``dispatched_ms``), taken by the worker (``taken_ms``), its
    #: micro-batch started (``started_ms``), its result made (``completed_ms``).
    admitted_ms: Int64 | None = None
    dispatched_ms: Int64 | None = None
    completed_ms: Int64 | None = None
    inference_ms: float | None = None
    fetched_ms: Int64 | None = None
    received_ms: Int64 | None = None
    taken_ms: Int64 | None = None
    started_ms: Int64 | None = None
    #: Served in an express batch (``Batch.express``): one request of an org
    #: that came in with nothing held, sent ahead of the orgs' turns, so a
    #: replay leaves its batch out of Jain's index as the simulator does.
    express: bool = False


class ResultPack(Message, kw_only=True):
    """Several results in one reply record, for senders that asked (``reply_packed``).

    The record carries the header ``sf-pack: 1``; results of one pack may
    belong to different requests of the same reply topic.
    """

    results: Annotated[list[Result], Meta(min_length=1)]


class BatchTiming(Message, kw_only=True):
    """Measured cost of one served request, fed back into the adaptive cost."""

    org: str
    tokens: Int64
    seconds: float


class WorkerEvent(Message, kw_only=True):
    """A worker's announcement: who it is, what it owns and how much room it has.

    Sent on start (``hello``), after each batch (``batch_done``), on a timer
    (``heartbeat``) and on shutdown (``bye``). The scheduler treats the
    latest event of a worker as the truth about its free slots; a worker
    silent for longer than the configured timeout loses its slots.
    """

    worker: str
    endpoint: EndpointName
    kind: Literal["hello", "heartbeat", "batch_done", "bye"]
    partitions: list[Int64]
    slots: Annotated[int, Meta(ge=0, le=1024)]
    free_slots: Annotated[int, Meta(ge=0, le=1024)]
    sent_ms: EpochMs
    #: Batches the worker still has in hand (taken but not yet finished).
    in_flight: list[str] = []
    #: Of ``in_flight``, the batches whose last micro-batch has started: their
    #: credit is returned, so the next batch can be on its way meanwhile.
    released: list[str] = []
    batch_id: str | None = None
    batch_requests: Int64 = 0
    batch_tokens: Int64 = 0
    inference_ms: float = 0.0
    #: ``batch_done``: how long the batch had the model (its service time) and
    #: how long the worker held it, from taking it off its partition to this
    #: report (ms, the worker's clock); the scheduler measures the round trip
    #: as its own time from sending the batch to reading this, less ``held_ms``.
    service_ms: float = 0.0
    held_ms: float = 0.0
    timings: list[BatchTiming] = []


class LaneState(Message, kw_only=True):
    """What the throttle needs to predict a new request's wait on one endpoint."""

    endpoint: str
    held_requests: Int64
    #: Held cost per tier, in the lane's cost units (tokens for ``tokens``).
    held_cost_by_tier: dict[str, float]
    held_tokens_by_tier: dict[str, Int64]
    #: Measured service rate, tokens per second, over all workers (0 = unknown):
    #: the rate left to the held work, net of the share express batches take
    #: (:class:`scheduler.snapshot.ServiceRate`).
    tokens_per_s: float
    free_slots: Int64
    workers: Int64
    #: Orgs with work waiting, per tier: a new request of a quiet org waits
    #: for about its own backlog times this many turns, not the whole tier.
    active_orgs_by_tier: dict[str, Int64] = {}
    #: Held tokens of the orgs holding the most (bounded to the top few);
    #: an org not listed holds less than the smallest value listed.
    org_held_tokens: dict[str, Int64] = {}
    #: Tokens of the batches sent to workers and not reported done: work
    #: every new request waits behind, whatever its tier.
    in_flight_tokens: Int64 = 0
    #: Measured time of one batch (ms), at most a full batch at
    #: ``tokens_per_s``: a request is served when its whole batch is, so the
    #: throttle adds batch times to the wait (0 = unknown).
    batch_ms: float = 0.0
    #: The lane serves its orgs in turns (DRR): an org's backlog here delays
    #: that org only, so admission may pace its records (producer/pacing.py).
    #: False: in arrival order (FIFO), or a scheduler older than the field.
    turns: bool = False
    #: Measured time of the Kafka hops a request still passes after admission
    #: that no other field counts (ms, 0 = unknown): the tier topic's (from
    #: ``admitted_ms`` to the scheduler reading it) and, the same kind of
    #: append and fetch that the scheduler cannot see, the result's way back
    #: (:class:`scheduler.snapshot.HopTime`).
    hops_ms: float = 0.0


class FeedbackMark(Message, kw_only=True):
    """The last ``batch_done`` of one worker whose timings a cost state includes."""

    sent_ms: Int64
    batch_id: str | None = None


class CostState(Message, kw_only=True):
    """An adaptive lane's measured costs, for a standby to take over (see ``scheduler.handover``).

    Seconds per token, moving averages: the endpoint's and each org's;
    ``marks`` names, per worker, the last report folded in, so the next
    leader replays only the reports that came after.
    """

    lane_spt: float | None = None
    org_spt: dict[str, float] = {}
    marks: dict[str, FeedbackMark] = {}


class SchedulerState(Message, kw_only=True):
    """Backlog snapshot the scheduler publishes for admission's throttle.

    ``costs`` (adaptive lanes only) is for the standby schedulers: a new
    leader charges the same costs as the one it replaces.
    """

    sent_ms: EpochMs
    lanes: dict[str, LaneState]
    held_requests: Int64
    epoch: Int64 = 0
    costs: dict[str, CostState] = {}
    #: The newest ``admitted_ms`` among the requests the scheduler had read
    #: when it took the snapshot: admission counts on top of the snapshot
    #: only what it admitted after that (still on the tier topic). None:
    #: nothing read yet, or a scheduler from before this field.
    admitted_through_ms: EpochMs | None = None


class LeaderClaim(Message, kw_only=True):
    """A record of the one-partition ``scheduler-leader`` topic: who leads, in log order.

    ``kind`` says which: ``claim`` (a scheduler that heard nothing from the
    leader for ``leader_silence_ms`` takes over from epoch ``after``; the
    first claim in the log naming the epoch then in force wins), ``beat``
    (the leader is alive, every ``leader_silence_ms / 5``) or ``resign``
    (the leader stopped cleanly: a standby claims at once). The rules are
    :mod:`scheduler.leadership`. ``epoch`` grows with every takeover;
    batches and snapshots carry it so that workers and admission can tell
    a deposed leader's output from the current one's.
    """

    instance: str
    #: At most 2**62: the next leader goes one higher, and an epoch must stay an
    #: int64 (Batch.epoch).
    epoch: Annotated[int, Meta(ge=1, le=2**62)]
    sent_ms: EpochMs
    kind: Literal["claim", "beat", "resign"] = "claim"
    #: The epoch a claim takes over from (0: none known); a beat repeats its
    #: leader's, so a reader that missed the claim still learns the chain.
    after: Annotated[int, Meta(ge=0, le=2**62)] = 0
    #: A beat's: every batch of this leader's that holds a request not yet
    #: committed on its tier partition was written at or after this wall-clock
    #: time (ms, the leader's clock): where a successor starts reading the
    #: batch topics for what was dispatched already.
    floor_ms: EpochMs | None = None
    #: A beat's: when this leader's fences were all acknowledged (ms, its clock).
    fenced_ms: EpochMs | None = None


class DeadLetter(Message, kw_only=True):
    """A message no service could use, kept with the reason instead of lost."""

    source_topic: str
    partition: Int64
    offset: Int64
    reason: str
    error: str
    payload: bytes
    key: bytes | None = None
    seen_ms: Int64 = 0
