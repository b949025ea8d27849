"""Every consumer's background fetcher looks for work at consumer_timeout_ms, not aiokafka's 200."""

from plumbing.kafka import KafkaSettings, make_consumer


async def test_the_setting_reaches_aiokafkas_fetcher_timeout():
    """aiokafka's fetcher slept up to 200 ms before fetching again; ours wakes at 20 ms.

    In the CPU demo a batch sometimes reached its worker ~190 ms after the
    scheduler wrote it; at 20 ms none took over 20 ms (git show f1ddd8c:docs/demo.md).
    """
    default = make_consumer(KafkaSettings(bootstrap="127.0.0.1:9"), "t")
    follower = make_consumer(KafkaSettings(bootstrap="127.0.0.1:9"), "t", follower=True)
    slower = make_consumer(KafkaSettings(bootstrap="127.0.0.1:9", consumer_timeout_ms=50), "t")
    # aiokafka 0.14 keeps it in seconds and hands it to its fetcher at start.
    assert default._consumer_timeout == 0.02
    assert follower._consumer_timeout == 0.02
    assert slower._consumer_timeout == 0.05
