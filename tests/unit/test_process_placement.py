"""A service process's CPUs and niceness, taken between fork and exec (``app.processes``)."""

import os
import subprocess
import sys

import pytest

from app.processes import placement

#: The child reports its main thread's niceness and CPUs, and a new thread's niceness.
PROBE = ("import os, threading; out = []; t = threading.Thread(target=lambda: out.append(os.nice(0)));"
         " t.start(); t.join(); print(os.nice(0), out[0], sorted(os.sched_getaffinity(0)))")


def _probe(preexec) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], preexec_fn=preexec,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split(maxsplit=2)


def test_nothing_to_place_runs_nothing_in_the_child():
    assert placement(None, 0) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_child_and_the_threads_it_starts_take_the_niceness_and_the_cpus():
    """The niceness is the child's own and its threads' too (torch's start after exec)."""
    ours = os.nice(0)
    if ours >= 19:
        pytest.skip("already at the lowest priority")
    cpu = min(os.sched_getaffinity(0))
    main, thread, cpus = _probe(placement({cpu}, 3))
    assert int(main) == int(thread) == min(19, ours + 3)
    assert cpus == f"[{cpu}]"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_niceness_alone_leaves_the_cpus_as_they_were():
    main, _, cpus = _probe(placement(None, 2))
    assert int(main) == min(19, os.nice(0) + 2)
    assert cpus == str(sorted(os.sched_getaffinity(0)))
