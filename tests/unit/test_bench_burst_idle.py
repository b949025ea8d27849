"""bench/burst.py's model_idle_ms: where one worker's model was not running a burst."""

from bench.burst import model_idle_ms


def test_ramp_and_the_gaps_between_calls_are_counted_and_overlaps_are_not():
    # created, started, completed: call A 100-110 (two results, first at 110),
    # call B starts 110 (back to back), call C starts 125 after B ended at 120.
    stamps = [(0, 100, 110), (5, 100, 111), (7, 110, 120), (9, 125, 135), (9, 125, 136)]
    assert model_idle_ms(stamps) == (100.0, 5.0)


def test_a_call_that_started_before_the_last_results_were_stamped_is_no_gap():
    """The loop stamps results after the call ends: the next one may start before that."""
    assert model_idle_ms([(0, 10, 20), (0, 19, 30)]) == (10.0, 0.0)


def test_no_results_no_figure():
    assert model_idle_ms([]) is None
