"""A request's time split by stage, and where late requests lost theirs."""

from schemas.messages import Result
from traffic.stages import (
    HOPS,
    STAGES,
    excess_by_stage,
    excess_line,
    request_stages,
    stage_times,
    usual_stage_ms,
)


def _result(status: str = "ok", **stamps) -> Result:
    return Result(id="r1", status=status, **stamps)


STAMPED = {"created_ms": 1_000, "fetched_ms": 1_010, "admitted_ms": 1_011, "received_ms": 1_030,
           "dispatched_ms": 1_100, "taken_ms": 1_105, "started_ms": 1_120, "completed_ms": 1_170}


def test_request_stages_splits_a_stamped_result_by_its_stamps():
    assert request_stages(_result(**STAMPED), 1_176.0) == {
        "to admission": 10.0, "admission": 1.0, "tier topic": 19.0, "scheduler queue": 70.0,
        "batch topic": 5.0, "worker queue": 15.0, "inference": 50.0, "delivery": 6.0}


def test_a_missing_stamp_leaves_out_both_stages_it_bounds():
    stamps = STAMPED | {"received_ms": None}
    got = request_stages(_result(**stamps), 1_176.0)
    assert "tier topic" not in got and "scheduler queue" not in got
    assert got["to admission"] == 10.0 and got["delivery"] == 6.0


def test_stage_times_counts_ok_results_only():
    times = stage_times([(_result(**STAMPED), 1_176.0),
                         (_result("rejected", **STAMPED), 1_500.0)])
    assert times["delivery"] == [6.0]
    assert list(times) == [name for name, _, _ in STAGES]


def test_excess_by_stage_sums_only_what_is_beyond_the_usual_time():
    typical = {"tier topic": 10.0, "scheduler queue": 40.0, "inference": 50.0}
    late = [{"tier topic": 60.0, "scheduler queue": 30.0, "inference": 50.0},
            {"tier topic": 12.0, "scheduler queue": 100.0, "delivery": 7.0}]
    got = excess_by_stage(late, typical)
    assert got["tier topic"] == 52.0        # 50 + 2
    assert got["scheduler queue"] == 60.0   # below its usual time adds nothing, then 60
    assert got["inference"] == 0.0
    assert got["delivery"] == 7.0           # no usual time: counted whole
    assert got["to admission"] == 0.0


def test_excess_line_gives_each_stage_its_share():
    line = excess_line({"to admission": 0.0, "tier topic": 75.0, "scheduler queue": 25.0},
                       3, label="burst")
    assert line == ("burst: 3 requests over it; their time beyond the unloaded p50: "
                    "tier topic 75 ms (75 %), scheduler queue 25 ms (25 %); "
                    "a request: Kafka hops 25 ms, in the services 8 ms")
    assert excess_line({"tier topic": 0.0}, 0, label="burst") == "burst: 0 requests over it"


def test_the_hops_are_stages():
    assert HOPS <= {name for name, _, _ in STAGES}
    assert "scheduler queue" not in HOPS and "inference" not in HOPS


def test_usual_stage_ms_is_each_stages_p50_over_ok_results():
    slow = STAMPED | {"completed_ms": 1_370}  # inference 250 ms
    results = [(_result(**STAMPED), 1_176.0), (_result(**STAMPED), 1_176.0),
               (_result(**slow), 1_376.0), (_result("rejected", **slow), 9_999.0)]
    usual = usual_stage_ms(results)
    assert usual["inference"] == 50.0 and usual["delivery"] == 6.0
    assert usual_stage_ms([]) == {}
