"""plumbing.kafka.kafka_connected: a configured cluster is used as given; the embedded
broker's short group sessions reach the services started as processes too."""

from plumbing.kafka import (
    EMBEDDED_SESSION,
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    kafka_connected,
    settings_from_env,
)


async def test_a_configured_cluster_is_used_as_given():
    """No broker started and no session changed: an operator's settings stand."""
    given = KafkaSettings(bootstrap="kafka-1:9092", session_timeout_ms=45_000)
    async with kafka_connected(given) as kafka:
        assert kafka == given


def test_the_environment_form_sets_the_same_sessions():
    """A service reading EMBEDDED_SESSION_ENV gets EMBEDDED_SESSION, not an unknown name."""
    got = settings_from_env(EMBEDDED_SESSION_ENV)
    assert got.session_timeout_ms == EMBEDDED_SESSION["session_timeout_ms"] != \
        KafkaSettings().session_timeout_ms
    assert got.heartbeat_interval_ms == EMBEDDED_SESSION["heartbeat_interval_ms"] != \
        KafkaSettings().heartbeat_interval_ms
