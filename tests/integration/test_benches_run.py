"""Each bench that checks a target still runs, as a user runs it, and writes its keys.

The speed and memory targets are checked by the benches in ``bench/``, and
nothing else runs them: ``bench/latency.py`` wrapped two methods whose
signatures later grew a keyword, and from then on it died with every request
missing, for four days, with nothing to say so. Each bench here runs at its
smallest size (the figures mean nothing at that size; only that it ran), as
a user runs it: a process of its own on a broker of its own (the embedded
one, with the short group timeouts the benches set for it). What is checked
is its exit status and the ``--json`` keys an issue or the docs name, each a
finite, positive number where it must be a number. No figure is compared
with a target: these machines are shared.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Longest a bench may take at these sizes (each takes 4-30 s on 2 cores).
LIMIT_S = 240

#: script, its smallest arguments, the keys its JSON must hold as finite,
#: positive numbers, and the keys it must hold at all (a dotted key reaches
#: into a mapping; ``[0]`` into a list's first item).
BENCHES = [
    ("latency", ["--requests", "30", "--repeat", "1"],
     ["added.p50", "e2e.p99", "own.p50"], ["per_round_added_p50"]),
    ("pipeline", ["--requests", "300", "--repeat", "1"],
     ["ratio", "ratio_processes", "admission_ratio", "scheduler_ratio", "worker_ratio",
      "scheduler_phases_ms.[0].first_held_ms", "scheduler_phases_ms.[0].all_read_ms"], []),
    ("gpu_feed", ["--quick", "--burst", "1000", "--quiet-s", "2"],
     ["1.busy", "1.quiet_p99_ms", "1.quiet_unloaded_p99_ms", "1.batch_ms", "1.round_trip_ms"],
     ["1.backlog_written", "1.backlog_read"]),
    # The burst from a client with an in-flight bound (the 1,000 goes out 400 at a time).
    ("isolation", ["--quick", "--bursts", "500,1000:16", "--seconds", "6",
                   "--burst-in-flight", "400"],
     ["[0].full_batch_ms", "[0].peak_rss_mb.+500.scheduler", "[0].burst_in_flight"],
     ["[0].orgs", "[0].over_bound.+1,000:16.sent_after_burst_s", "[0].not_ok", "[0].twice",
      "[0].burst_span_s.+500"]),
    ("result_size", ["--requests", "100", "--repeat", "1"], [], ["variants", "requests"]),
    ("sustained", ["--quick"],
     ["loads.80.capacity_rps", "loads.80.live_on.busiest_p99_ms",
      "loads.80.live_off.busiest_p99_ms", "loads.80.sim_on.busiest_p99_ms",
      "loads.80.live_on.worst_light_p99_ms", "loads.80.live_on.batch_fill",
      "loads.80.live_on.tokens_per_model_s", "loads.80.sim_off.tokens_per_model_s",
      "loads.80.live_on.peak_rss_mib.scheduler", "express_ratio_80", "live_vs_sim_80"],
     ["loads.80.live_on.express_share", "loads.80.live_off.express_share",
      "loads.80.live_on.org_p99_ms", "live_vs_sim_off_80"]),
    ("raw_chain", ["--quick"], ["chain_ratio", "chain_ratio_processes"], []),
    ("fleet", ["--fleets", "2", "--seconds", "0.5"],
     ["fleets.2.busy", "fleets.2.busy_whole", "fleets.2.served_rps", "fleets.2.capacity_rps"],
     ["largest_fleet_at_target", "fleets.2.longest_gap_ms", "fleets.2.idle_in_gaps_over_10ms"]),
    ("memory", ["--quick"], ["overhead_bytes"], ["breakdown"]),
    ("batching", ["--quick", "--texts", "64", "--repeat", "1"],
     ["ratio_sorted", "ratio_given"], []),
    ("worker", ["--texts", "32", "--max-tokens", "64", "--repeat", "1", "--skip-batching"],
     ["ratio", "shape_ratio", "pipeline_tps"], []),
    ("core", ["--quick", "--orgs", "10,1000", "--rounds", "1"],
     ["rows.[0].drr_sel_per_s", "drr_growth", "held_bytes.deadline"], []),
    # The aiohttp load generator: wrk need not be installed where the tests run.
    ("gateway", ["--seconds", "1", "--repeat", "1", "--concurrency", "16", "--waiting", "50",
                 "--loadgen", "python"],
     ["gateway_rps", "direct_rps", "gateway_ratio", "waiting_requests"],
     ["added_p50_ms", "added_p99_ms", "rss_per_waiting_kib"]),
]
#: Exit statuses that are verdicts, not failures (their JSON is written first, so an
#: exception, which leaves none, still fails): isolation.py exits 1 for a quiet org over
#: its bound; core.py 1 for a target not met and 2 for targets its org counts do not reach.
VERDICTS = {"isolation": {1}, "core": {1, 2}}


def dig(figures: object, key: str) -> object:
    """``figures`` at a dotted key (``[0]`` takes a list's first item); KeyError if absent."""
    at = figures
    for part in key.split("."):
        if part == "[0]":
            if not isinstance(at, list) or not at:
                raise KeyError(f"{key}: not a non-empty list at {part}")
            at = at[0]
        elif isinstance(at, dict) and part in at:
            at = at[part]
        else:
            raise KeyError(f"{key}: no {part!r}")
    return at


def run_bench(script: str, args: list[str], out: Path) -> str:
    """Run ``bench/<script>.py`` with ``args`` and ``--json out``; its output, or a failure."""
    command = [sys.executable, str(ROOT / "bench" / f"{script}.py"), *args, "--json", str(out)]
    try:
        done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True,
                              timeout=LIMIT_S)
    except subprocess.TimeoutExpired as e:
        # What was captured comes as bytes here, text=True or not.
        tail = (e.stdout or b"")[-3000:].decode(errors="replace")
        pytest.fail(f"bench/{script}.py did not end within {LIMIT_S} s; its output ended:\n{tail}")
    output = done.stdout + done.stderr
    allowed = {0} | VERDICTS.get(script, set())
    assert done.returncode in allowed, (f"bench/{script}.py exited {done.returncode}:\n"
                                        f"{output[-3000:]}")
    assert out.exists(), f"bench/{script}.py wrote no --json file:\n{output[-3000:]}"
    return output


@pytest.mark.parametrize(("script", "args", "numbers", "present"), BENCHES,
                         ids=[b[0] for b in BENCHES])
def test_the_bench_runs_and_writes_its_keys(script: str, args: list[str], numbers: list[str],
                                            present: list[str], tmp_path: Path):
    out = tmp_path / f"{script}.json"
    output = run_bench(script, args, out)
    figures = json.loads(out.read_text())
    for key in present:
        dig(figures, key)
    for key in numbers:
        value = dig(figures, key)
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (f"bench/{script}.py: {key} = {value}",
                                                    output[-2000:])


def test_a_missing_key_is_named():
    """The key check itself: a key that is not there fails, and says which."""
    figures = {"1": {"busy": 0.9}}
    assert dig(figures, "1.busy") == 0.9
    with pytest.raises(KeyError, match="quiet_p99_ms"):
        dig(figures, "1.quiet_p99_ms")
    with pytest.raises(KeyError, match=r"\[0\]"):
        dig({"x": []}, "x.[0]")
