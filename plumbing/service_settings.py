"""Every service's settings, each field documented once.

The runtime knobs of admission, the scheduler and a worker, side by side:
the one place an operator reads to see what each service can be told, as
TEI's ``router/src/main.rs`` lists every flag of its router. Each class is
one service's, built on :class:`plumbing.settings.ServiceSettings`; each
field is a flag, an ``SF_<SERVICE>_*`` environment variable and its own
validation (:mod:`plumbing.settings`). What the fleet shares (tenants,
endpoints, limits) is the configuration file, :mod:`schemas.config`; how to
reach Kafka is :class:`plumbing.kafka.KafkaSettings`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from plumbing.settings import ServiceSettings, doc
from schemas.config import Policy

__all__ = ["AdmissionSettings", "GatewaySettings", "SchedulerSettings", "WorkerSettings"]


class AdmissionSettings(ServiceSettings, frozen=True):
    """Tuning of one admission instance; the registry itself is the Config.

    Every field is also a flag (``--max-step-records``) and an environment
    variable (``SF_ADMISSION_MAX_STEP_RECORDS``), see :mod:`plumbing.settings`.
    """

    max_step_records: Annotated[int, doc(
        "Records decided per step, one (partition, org) group at a time in turn "
        "(producer/readahead.py); a step's writes go out together. A record fetched "
        "while a step is decided waits for it: 100 keeps that wait a few ms under a "
        "burst (docs/design.md).", ge=1)] = 100
    max_step_bytes: Annotated[int, doc(
        "Bytes of input a step holds at most: under a burst of long texts a step's "
        "writes stay small, and a quiet org's record decided in the next step does not "
        "wait behind one large produce request.", ge=1)] = 256 * 1024
    read_ahead_records: Annotated[int, doc(
        "Fetched records held undecided at most. A quiet org's record fetched behind a "
        "burst on its partition is decided in the next step instead of after the burst; "
        "offsets are committed in log order all the same.", ge=1)] = 50_000
    backlog_after_records: Annotated[int, doc(
        "Once the read-ahead holds backlog_from_records, an org with this many records "
        "read ahead has its later ones written to the backlog topic, several to a "
        "record, and read back as it is served (and so has every new one while some are "
        "there, so its order holds): a burst of any size waits in Kafka, not in the "
        "read-ahead every other org's records pass through (producer/backlog.py). A "
        "backlog partition is read while fewer than this many records wait for it. 0: "
        "never (a burst larger than read_ahead_records stops the fetches).",
        ge=0)] = 2_000
    backlog_from_records: Annotated[int, doc(
        "Records read ahead in all before any goes to the backlog topic: a burst the "
        "read-ahead holds below it is paced there and not copied (a copy written as a "
        "burst arrives costs every org sharing the broker's and the services' cores: "
        "docs/load.md). Keep it under half of read_ahead_records, where pacing stops. "
        "0: from the first record.", ge=0)] = 20_000
    shape_org_per_s: Annotated[float, doc(
        "Records of one org this instance decides per second at most, past "
        "shape_org_burst at once; the rest wait in the read-ahead, uncommitted, and are "
        "decided at this rate, so a burst's relay is spread over its service time instead "
        "of filling shared CPUs in its first second (producer/shaping.py, with what it "
        "costs). Set it above what the fleet serves for one org. 0: no shaping.",
        ge=0)] = 0.0
    pace_backlog_s: Annotated[float, doc(
        "An org's records wait in the read-ahead, uncommitted, while the scheduler holds "
        "this many seconds of service for it (its snapshot, the lane's measured rate, plus "
        "what this instance admitted since): more there would not be served sooner, and "
        "relaying a burst as fast as it arrives fills shared CPUs in its first second "
        "(producer/pacing.py, with what it costs). Lanes that serve orgs in turns only "
        "(not FIFO); nothing is paced without a fresh snapshot. 0: no pacing.",
        ge=0)] = 1.0
    pace_cold_batches: Annotated[float, doc(
        "Before a lane's rate is measured, an org is paced while the scheduler holds this "
        "many full batches (max_batch_tokens) for it: the burst's first second is not all "
        "relayed in the window before the first rate (producer/pacing.py). 0: nothing is "
        "paced before a measured rate.", ge=0)] = 4.0
    shape_org_burst: Annotated[int, doc(
        "Records one org may have decided at once before shape_org_per_s applies.",
        ge=1)] = 200
    max_partition_fetch_bytes: Annotated[int, doc(
        "Bytes read per ingress partition per fetch: large, so reading ahead past a "
        "burst takes few fetches.", ge=1024)] = 1024 * 1024
    steps_in_flight: Annotated[int, doc(
        "Steps handed to the producer and not yet settled (acknowledged, offsets "
        "released) while the next one is decided.", ge=1)] = 8
    commit_interval_ms: Annotated[int, doc(
        "At most one ingress commit per this interval while steps keep coming (a step "
        "settled with none behind it is committed at once).", ge=0)] = 200
    stop_settle_s: Annotated[float, doc(
        "How long a stop waits for the steps in hand to be settled.", ge=0)] = 30.0
    poll_timeout_ms: Annotated[int, doc(
        "Longest wait for ingress records before checking for a stop request.",
        ge=1)] = 100
    state_stale_after_ms: Annotated[float | None, doc(
        "Scheduler snapshots older than this do not throttle; unset: the larger of 5 s "
        "and 20 scheduler intervals (service.state_interval_ms).")] = None
    config_poll_ms: Annotated[int, doc(
        "How often the configuration file's modification time is checked for a hot "
        "reload; 0 reloads only on SIGHUP.", ge=0)] = 2_000
    token_counter: Annotated[str | None, doc(
        "Count tokens with this model spec for every endpoint instead of the "
        "endpoint's model ('fake' counts words: tests and dry runs).")] = None
    reply_send_attempts: Annotated[int, doc(
        "Attempts for a result on a reply topic before it goes to the dead letters (a "
        "reply topic may not exist on a cluster without auto-create).", ge=1)] = 3
    pack_tier_records: Annotated[bool, doc(
        "Write what one step admits for one org as one tier record (an AdmittedPack, "
        "docs/protocol.md) instead of one record per request. Schedulers read both forms; "
        "set false while schedulers older than packs still run (a rolling upgrade: "
        "schedulers first).")] = True


class SchedulerSettings(ServiceSettings, frozen=True):
    """How the service runs (the fairness settings are in the configuration file).

    Every field is also a flag (``--commit-interval-ms``) and an environment
    variable (``SF_SCHEDULER_COMMIT_INTERVAL_MS``), see :mod:`plumbing.settings`.
    """

    policy: Annotated[Policy, doc(
        "drr (fair) or fifo (the baseline, for comparisons).")] = "drr"
    commit_interval_ms: Annotated[int, doc(
        "How often tier offsets are committed. Lower replays less after a crash, at one "
        "commit request per interval.", ge=1)] = 500
    max_poll_records: Annotated[int, doc(
        "Tier records taken per intake slice; also the most the held count can overshoot "
        "max_held_requests by before the consumers pause.", ge=1)] = 500
    state_top_orgs: Annotated[int, doc(
        "Orgs listed in each lane's org_held_tokens snapshot.", ge=0)] = 20
    linger_ms: Annotated[int, doc(
        "Producer linger for batches and results. 0: a batch goes out the moment a "
        "worker has credit.", ge=0)] = 0
    express_batches: Annotated[bool, doc(
        "When the workers' credit is spent and an org that came in with nothing held "
        "waits, send one batch beyond it of one request of each such org (topped up: "
        "express_fill), whose first call the worker runs next (scheduler/dispatch.py): "
        "a quiet org waits for the model call "
        "in progress, not for the batch queued behind it. DRR only; one per worker at a "
        "time.")] = True
    express_fill: Annotated[float, doc(
        "An express batch is topped up in DRR order, behind its fresh requests, to this "
        "share of the endpoint's max_batch_tokens. 0, the default, sends the fresh "
        "requests alone: the worker runs them in the call waiting next where that call "
        "has room (one fixed cost for both: worker/model_thread.py), which a top-up "
        "would leave too big to join. 1 (a full batch) makes an express batch take the "
        "place of a regular one, but a quiet org under a burst waits longer for the next "
        "express batch (a full one returns its credit later) (docs/load.md, 'An express "
        "call that rides the next one', 'Express batches as full batches').",
        ge=0.0, le=1.0)] = 0.0
    express_horizon: Annotated[float, doc(
        "No express batch while a batch sent at a worker's next credit would start "
        "within this many full-batch times (the work whose credit the worker has not "
        "returned, at its measured speed): the fresh orgs' requests go first in that "
        "regular batch instead, at no extra model call. 1 keeps a fleet busy for long "
        "at the model's speed (few express batches) but makes a quiet org under a burst "
        "wait for the queued batch (about one batch more at p99); 0, the default, sends "
        "an express batch whenever the credit is spent (docs/design.md, docs/load.md "
        "'An express horizon').",
        ge=0.0, le=100.0)] = 0.0
    leader_silence_ms: Annotated[int, doc(
        "A standby takes over after reading nothing from the leader for this long (the "
        "leader beats every fifth of it and dispatches only within 0.7 of it after a "
        "beat it read back): a crashed leader is replaced about this long after its last "
        "beat, with no consumer-group session involved (docs/reliability.md).",
        ge=50, le=600_000)] = 1000
    config_path: Annotated[str | None, doc(
        "The configuration file, reloaded on SIGHUP and when its modification time "
        "changes; unset: no file.")] = None
    config_poll_ms: Annotated[int, doc(
        "How often the file's modification time is checked; 0: on SIGHUP only.",
        ge=0)] = 2_000


class WorkerSettings(ServiceSettings, frozen=True, kw_only=True):
    """How one worker runs. The endpoint's batch limits come from the configuration.

    Every field is also a flag (``--microbatch-size``) and an environment
    variable (``SF_WORKER_MICROBATCH_SIZE``), see :mod:`plumbing.settings`.
    """

    endpoint: Annotated[str, doc("The endpoint this worker serves.")]
    model: Annotated[str | None, doc(
        "Model spec; unset: the endpoint's model ('fake' for tests).")] = None
    slots: Annotated[int | None, doc(
        "The most batches held at once whose credit is not returned; unset: "
        "service.worker_slots.")] = None
    worker_id: Annotated[str | None, doc(
        "Unique per process; the scheduler counts credit by it (unset: "
        "host-pid-random).")] = None
    threads: Annotated[int | None, doc("torch intra-op threads; unset: torch's default.")] = None
    device: Annotated[str | None, doc(
        "cpu, cuda, cuda:1...; unset: CUDA when torch sees a GPU, else the CPU.")] = None
    microbatch_tokens: Annotated[int, doc(
        "Micro-batch budget in padded tokens (texts x longest text): bounds memory and "
        "keeps the first results early.", ge=1)] = 4096
    microbatch_size: Annotated[int, doc("Texts per micro-batch at most.", ge=1)] = 32
    microbatch_call_tokens: Annotated[Annotated[float, msgspec.Meta(ge=0)] | None, doc(
        "What one model call's fixed cost is worth in padded tokens: a batch is cut into "
        "micro-batches where one call more costs less than the padding it saves. Unset: "
        "learned from the worker's own calls (worker/call_cost.py); 0: each call filled to "
        "microbatch_tokens in turn, as before 2026-12-07.")] = None
    revoke_wait_s: Annotated[float, doc(
        "How long a rebalance waits for batches in hand on revoked partitions, so they "
        "commit here rather than run again elsewhere.", ge=0)] = 5.0
    drain_s: Annotated[float, doc(
        "How long a stop waits for the batches in hand to finish.", ge=0)] = 60.0
    answered_window_s: Annotated[float, doc(
        "A request id answered within this many seconds is not run again when a batch "
        "brings it back (a batch redelivered after a rebalance, or written by a scheduler "
        "that lost leadership while paused): skipped and counted in "
        "sf_worker_duplicate_requests_total. 0: off.", ge=0)] = 300.0
    answered_max_ids: Annotated[int, doc(
        "Answered ids remembered at most for answered_window_s (the oldest go first): "
        "about 100 bytes each.", ge=0)] = 200_000
    warm_up: Annotated[bool, doc(
        "Run a few batches of different shapes before joining the group: the first calls "
        "of a shape are slow (kernel selection, allocator growth), and the first real "
        "requests should not pay for that.")] = True


class GatewaySettings(ServiceSettings, frozen=True):
    """How one HTTP gateway runs (its keys are the configuration's ``api_keys``).

    Every field is also a flag (``--max-waiting-requests``) and an environment
    variable (``SF_GATEWAY_MAX_WAITING_REQUESTS``), see :mod:`plumbing.settings`.
    """

    host: Annotated[str, doc(
        "Address the HTTP API listens on (0.0.0.0 in a container).")] = "127.0.0.1"
    port: Annotated[int, doc(
        "Port of the HTTP API (OpenAI, Cohere and TEI routes); 0: any free port.",
        ge=0, le=65535)] = 8080
    gateway_id: Annotated[str | None, doc(
        "This replica's name: its reply topic is <prefix>replies.gateway-<id>. Give each "
        "replica its own, stable across restarts (a pod name; characters other than "
        "letters, digits and ._- become -); unset: random per start.")] = None
    max_body_bytes: Annotated[int, doc(
        "Largest request body; a larger one gets 413 before it is read (by its "
        "Content-Length) or as soon as it passes the limit.", ge=1024)] = 4 * 1024 * 1024
    max_waiting_requests: Annotated[int, doc(
        "Requests waiting for their result at once; one more gets 503 at once, so the "
        "memory the waits hold is bounded (docs/benchmarks.md measures it per request).",
        ge=1)] = 10_000
    org_waiting_share: Annotated[float, doc(
        "The share of max_waiting_requests one org may have waiting at once; its next "
        "request past it gets 429 (org_waiting_limit, Retry-After) while other orgs still "
        "get in, so one org's bulk job cannot fill the gateway. 1: no limit of its own.",
        gt=0, le=1)] = 0.5
    max_wait_ms: Annotated[int, doc(
        "Deadline of a request whose client sends no timeout (x-stainless-read-timeout, "
        "X-Request-Timeout); a client's longer timeout is cut to it. The pipeline expires "
        "work past it, so nothing is served that nobody waits for.",
        ge=1, le=86_400_000)] = 60_000
    result_grace_ms: Annotated[int, doc(
        "How long past a request's deadline the gateway still waits for its result (the "
        "pipeline's 'expired' answer) before answering 504 itself.", ge=0)] = 5_000
    drain_s: Annotated[float, doc(
        "On SIGTERM, how long requests already waiting get to be answered; new ones get "
        "503 meanwhile, and any still waiting after it get 503.", ge=0)] = 30.0
    tei_embed_endpoint: Annotated[str | None, doc(
        "The endpoint TEI's POST /embed serves (TEI's bodies name no model); unset: the "
        "first embed endpoint of the configuration.")] = None
    tei_rerank_endpoint: Annotated[str | None, doc(
        "The endpoint TEI's POST /rerank serves; unset: the first rerank endpoint.")] = None
    config_path: Annotated[str | None, doc(
        "The configuration file, reloaded on SIGHUP (keys added and revoked at once) and "
        "when its modification time changes; unset: no file.")] = None
    config_poll_ms: Annotated[int, doc(
        "How often the file's modification time is checked; 0: on SIGHUP only.",
        ge=0)] = 2_000
