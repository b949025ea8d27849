"""Topic creation, checked: every topic exists with its partitions before use.

Clients must never be the ones to create topics. Both brokers we run on
auto-create a topic the moment a client names it, with a default partition
count (4 on Tansu) that is wrong for batch topics, whose partitions are worker
slots; and on Tansu even a metadata request *for a named topic* creates it.
So services call :func:`ensure_topics` first, and the check that follows the
creation lists all topics rather than asking for each by name.

Creation is idempotent and safe to repeat after a broker restart (Tansu loses
every topic then). "Already exists" arrives in two ways: as error 36 inside
the response (Tansu, and aiokafka never raises on it) or as a raised
``TopicAlreadyExistsError`` (other clients and proxies); both count as
success. A topic that exists with *fewer* partitions than asked is an error:
the scheduler would address partitions that are not there. More is fine.

Also the ``topics`` subcommand: create every topic of a configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from plumbing.kafka import KafkaSettings, add_kafka_arguments, make_admin, settings_from_args

__all__ = [
    "TopicError",
    "add_arguments",
    "delete_topics",
    "describe_topics",
    "ensure_topics",
    "run",
    "wait_for_topics",
]

_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z")
_ALREADY_EXISTS = TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = 3


class TopicError(RuntimeError):
    """A topic is missing, misshapen or refused; the message names it."""


def _check_specs(specs: Mapping[str, int]) -> None:
    # Tansu accepts illegal names and zero partitions without complaint;
    # Kafka would refuse them, so refuse them here for both.
    for name, partitions in specs.items():
        if not _LEGAL_NAME.match(name) or name in (".", ".."):
            raise TopicError(f"illegal topic name {name!r}: use 1-249 of [A-Za-z0-9._-]")
        if not isinstance(partitions, int) or partitions < 1:
            raise TopicError(f"topic {name!r}: partitions must be >= 1, got {partitions!r}")


async def ensure_topics(
    settings: KafkaSettings,
    specs: Mapping[str, int],
    *,
    replication_factor: int = 1,
    timeout_s: float = 15.0,
) -> dict[str, int]:
    """Create each ``name -> partitions`` topic unless it exists, then verify.

    Returns the partition count each topic has now (at least the requested).
    Retries transient errors until ``timeout_s``; raises :class:`TopicError`
    for a topic with fewer partitions than requested, an illegal spec, or a
    refusal, and ``TimeoutError`` naming the topics still missing.
    """
    _check_specs(specs)
    if not specs:
        return {}
    deadline = time.monotonic() + timeout_s
    admin = make_admin(settings)
    try:
        await _start(admin, deadline)
        await _create(admin, specs, replication_factor, deadline)
        return await _verify(admin, specs, deadline)
    finally:
        await admin.close()


async def wait_for_topics(
    settings: KafkaSettings, specs: Mapping[str, int], *, timeout_s: float = 15.0
) -> dict[str, int]:
    """Wait until every topic exists with at least its partitions; create nothing.

    For services that must not own topic creation but should not start
    before the topics do (their clients would auto-create them wrongly).
    """
    _check_specs(specs)
    deadline = time.monotonic() + timeout_s
    admin = make_admin(settings)
    try:
        await _start(admin, deadline)
        return await _verify(admin, specs, deadline)
    finally:
        await admin.close()


async def describe_topics(settings: KafkaSettings, prefix: str = "") -> dict[str, int]:
    """Every topic whose name starts with ``prefix``, with its partition count.

    Lists all topics in one metadata request: naming a missing topic in the
    request would create it on Tansu.
    """
    admin = make_admin(settings)
    try:
        await admin.start()
        return {n: p for n, p in (await _partition_counts(admin)).items() if n.startswith(prefix)}
    finally:
        await admin.close()


async def delete_topics(settings: KafkaSettings, names: Iterable[str]) -> list[str]:
    """Delete topics, best effort; returns the names the broker deleted.

    For tests and benchmarks: Tansu keeps everything in memory and enforces no
    retention, so long sessions must free what they wrote. Missing topics are
    skipped; other failures are swallowed (this is cleanup, never a reason to
    fail a run).
    """
    names = list(dict.fromkeys(names))
    if not names:
        return []
    admin = make_admin(settings)
    try:
        await admin.start()
        response = await admin.delete_topics(names)
    except KafkaError:
        return []
    finally:
        await admin.close()
    return [topic for topic, code in response.topic_error_codes if code == 0]


# -- internals -----------------------------------------------------------------


async def _start(admin: AIOKafkaAdminClient, deadline: float) -> None:
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await admin.start()
    except TimeoutError:
        raise TimeoutError("could not reach the Kafka cluster to manage topics") from None


async def _create(
    admin: AIOKafkaAdminClient, specs: Mapping[str, int], replication_factor: int, deadline: float
) -> None:
    pending = dict(specs)
    while pending:
        new = [NewTopic(n, p, replication_factor) for n, p in pending.items()]
        timeout_ms = max(1000, int((deadline - time.monotonic()) * 1000))
        try:
            response = await admin.create_topics(new, timeout_ms=timeout_ms)
        except TopicAlreadyExistsError:
            # One raise covers the whole request; the verification finds out
            # whether the others were created, and creates nothing itself.
            return
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise TopicError(f"creating topics {sorted(pending)} failed: {exc}") from exc
            await asyncio.sleep(0.1)
            continue
        retry: dict[str, int] = {}
        for entry in response.topic_errors:
            # (topic, code) in v0, (topic, code, message) from v1 on.
            topic, code = entry[0], entry[1]
            message = entry[2] if len(entry) > 2 else None
            if code in (0, _ALREADY_EXISTS):
                continue
            error = for_code(code)
            if error.retriable and time.monotonic() < deadline:
                retry[topic] = pending[topic]
                continue
            raise TopicError(f"creating topic {topic!r} failed: {error.__name__} ({message})")
        pending = retry
        if pending:
            await asyncio.sleep(0.1)


async def _verify(
    admin: AIOKafkaAdminClient, specs: Mapping[str, int], deadline: float
) -> dict[str, int]:
    # Creation may be acknowledged before metadata shows the topic (on Kafka
    # the controller propagates it), so poll briefly.
    while True:
        counts = await _partition_counts(admin)
        for name, wanted in specs.items():
            have = counts.get(name)
            if have is not None and have < wanted:
                raise TopicError(
                    f"topic {name!r} has {have} partitions but {wanted} are needed; "
                    "delete it or raise its partitions on the cluster"
                )
        missing = sorted(n for n in specs if counts.get(n, 0) == 0)
        if not missing:
            return {n: counts[n] for n in specs}
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics still missing: {', '.join(missing)}")
        await asyncio.sleep(0.05)


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    topics = await admin.describe_topics(None)
    return {
        t["topic"]: len(t["partitions"]) for t in topics if t["error_code"] != _UNKNOWN_TOPIC
    }


# -- the `topics` subcommand ---------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness topics``."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    parser.add_argument(
        "--replication-factor", type=int, default=1, help="replicas per partition (default 1)"
    )
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Create every topic the configuration needs and print them."""
    from schemas.config import load_config
    from schemas.topics import Topics

    settings = settings_from_args(args)
    if settings.bootstrap is None:
        # An embedded broker would vanish with its topics when this exits.
        print(
            "serving-fairness topics: give --bootstrap (or SF_BOOTSTRAP) of a cluster",
            file=sys.stderr,
        )
        return 2
    config = load_config(args.config)
    specs = Topics.of(config).all(config)
    counts = asyncio.run(
        ensure_topics(settings, specs, replication_factor=args.replication_factor)
    )
    for name, partitions in sorted(counts.items()):
        print(f"{name}\t{partitions}")
    return 0
