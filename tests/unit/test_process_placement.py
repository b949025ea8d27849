"""A service process's CPUs and niceness, taken between fork and exec (``app.processes``)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.processes import placement

REPO = Path(__file__).resolve().parents[2]

#: The child reports its main thread's niceness and CPUs, and a new thread's niceness.
PROBE = ("import os, threading; out = []; t = threading.Thread(target=lambda: out.append(os.nice(0)));"
         " t.start(); t.join(); print(os.nice(0), out[0], sorted(os.sched_getaffinity(0)))")


def _probe(preexec) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], preexec_fn=preexec,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split(maxsplit=2)


#: A parent that starts a child with ``placement`` (sleeping for a minute),
#: prints the child's pid and dies at once.
ORPHAN = ("import os, subprocess, sys; from app.processes import placement;"
          " c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
          " preexec_fn=placement(None, 0), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
          " print(c.pid, flush=True); os._exit(0)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_a_child_does_not_outlive_the_process_that_started_it():
    """The parent dies without a word: the kernel ends the service it started."""
    done = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the child outlived its parent by 10 s"


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
