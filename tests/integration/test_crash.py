"""Crash each service (SIGKILL) under load, as processes on a broker of their own.

The scenario and its figures are ``bench/crash.py`` (``docs/reliability.md``
has a full run); this runs it with short phases.
"""

from __future__ import annotations

import pytest

from bench.crash import passed, report, run

pytestmark = pytest.mark.integration


async def test_every_request_gets_one_result_across_crashes():
    """kill -9 of the leading scheduler, a worker, admission, each restarted, then a paused
    leader: every request one result, counted by id (none lost, none failed to submit, none
    twice, none foreign); none dispatched twice by a scheduler's takeover, and the paused
    leader's batches never taken after its successor's first."""
    lines: list[str] = []
    figures = await run(rate=30, phase_s=3, session_ms=2000, say=lines.append)
    print("\n".join(lines) + "\n" + report(figures))
    _assert_one_result_each(figures)
    assert set(figures["statuses"]) == {"ok"}, figures["statuses"]
    # Each recovery was seen, not timed out into a None.
    assert figures["scheduler_takeover_s"] is not None, "the standby never took over"
    assert figures["scheduler_first_result_s"] is not None, report(figures)
    assert figures["worker_rejoin_s"] is not None and figures["admission_ready_s"] is not None
    assert figures["admission_first_result_s"] is not None, report(figures)
    # The client hands each id over once: every extra copy written was dropped.
    assert figures["copies_written"] - figures["results"] == figures["client_duplicates_dropped"]
    # Takeovers: by the leader's beat, not a group session; nothing of the dead or
    # paused leader's dispatched again, nothing of the paused one's served late.
    by_crash = figures["dispatched_twice_by_crash"]
    assert by_crash["scheduler"] == 0 and by_crash["pause"] == 0, report(figures)
    assert figures["scheduler_first_result_s"] < 5, report(figures)  # 2 s unloaded: bench
    assert figures["paused_takeover_s"] is not None, "the standby never took over a paused leader"
    assert figures["paused_served_after_successor"] == 0, report(figures)
    assert figures["paused_leader_stands_by"], "the paused leader still leads after SIGCONT"


def _assert_one_result_each(figures: dict) -> None:
    assert figures["drained"], report(figures)
    assert figures["sent"] > 0
    assert figures["lost"] == 0, report(figures)
    assert figures["submit_errors"] == {} and figures["submit_failed"] == 0, report(figures)
    assert figures["duplicated"] == 0 and figures["foreign"] == 0, report(figures)
    assert figures["results"] == figures["sent"], report(figures)
    assert passed(figures)
    assert figures["failed_process"] is None


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_crashes_at_full_length_with_the_default_session():
    """The documented run at the default session (``python bench/crash.py --session-ms
    6000``, the slowest recoveries): every request one result, counted by id, and each
    recovery seen. Since CI runs the slow tests, the same run at a 2 s session is left to
    the command: the test above runs those three kills at 2 s with 3 s phases."""
    figures = await run(rate=40, phase_s=8, session_ms=6000)
    print(report(figures))
    _assert_one_result_each(figures)
    assert figures["scheduler_first_result_s"] is not None, report(figures)
    assert figures["admission_first_result_s"] is not None, report(figures)
    # Issue 50: the new leader's first result within 2 s of the kill at the default
    # session (python bench/crash.py --session-ms 6000 --rate 200 measures it); 3 s here,
    # where CI shares its cores (11.45 s before: the bound still fails the group design).
    assert figures["scheduler_first_result_s"] < 3, report(figures)
    by_crash = figures["dispatched_twice_by_crash"]
    assert by_crash["scheduler"] == 0 and by_crash["pause"] == 0, report(figures)
    assert figures["paused_served_after_successor"] == 0, report(figures)
