"""Integration fixtures: one embedded broker per session, fresh topics per test.

Tests share one Tansu process (starting one costs ~15 ms, but its clients'
connections and groups are what take time) and stay apart by topic prefix,
the way aiokafka's own suite does. Topics are deleted after each test because
Tansu keeps every record in memory and enforces no retention.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from plumbing.topics import delete_topics, describe_topics

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test in this folder needs the broker; mark them all so that
    # `-m "not integration"` deselects them without each file remembering.
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """The session's embedded broker. Do not stop or restart it in a test:
    start a private ``EmbeddedBroker`` for that."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def kafka_settings(broker: EmbeddedBroker) -> KafkaSettings:
    """Settings for the session broker with short group timeouts.

    Tansu holds a group join for session_timeout_ms / 2, so a 2 s session
    makes each join take ~1 s instead of 3 s at the production default.
    """
    return KafkaSettings(
        bootstrap=broker.bootstrap,
        client_id="sf-tests",
        session_timeout_ms=2000,
        heartbeat_interval_ms=500,
    )


@pytest.fixture
async def topic_prefix(kafka_settings: KafkaSettings) -> AsyncIterator[str]:
    """A prefix no other test uses; its topics are deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    yield prefix
    # Cleanup must never turn a pass into an error (e.g. when a test took
    # the broker down on purpose).
    with contextlib.suppress(Exception):
        await delete_topics(kafka_settings, await describe_topics(kafka_settings, prefix))
