"""``serving-fairness demo`` end to end as a process: its --log-file is JSON lines with the ids bound.

Slow (three phases, each on a fresh broker with the services as processes:
about a minute on two cores), so excluded by default; run it with
``pytest -m slow tests/integration/test_demo_logs.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_demo_log_file_is_json_lines_with_request_org_and_batch_ids(tmp_path: Path):
    """A small fake-model demo loses no request and reports a verdict true to its figures;
    every line of its log file is JSON; each request's admitted and served lines carry
    request_id and org, batches their batch_id, and every service process logs its totals.
    The paced orgs went through the gateway, every call answered 200 with the result's
    stamps, and no API key (``sf-`` and 43 characters) is in the log or the output."""
    log_file, figures_file = tmp_path / "services.log", tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", "--model", "fake", "--burst", "60",
         "--quiet", "2", "--skip-x5", "--timeout-s", "120", "--log-level", "debug",
         "--log-file", str(log_file), "--json", str(figures_file)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        check=False,
        timeout=600)
    assert figures_file.exists(), proc.stderr[-3000:]
    assert_verdict(proc, json.loads(figures_file.read_text()))
    events = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    names = Counter(e["event"] for e in events)
    admitted = [e for e in events if e["event"] == "request_admitted"]
    served = [e for e in events if e["event"] == "request_served"]
    assert len(admitted) >= 3 * 2 * 2 + 60 + 60  # quiet orgs x phases, two bursts
    assert all(e["request_id"] and e["org"] and e["logger"] == "admission" for e in admitted)
    assert all(e["request_id"] and e["org"] and e["batch_id"] for e in served)
    assert {e["request_id"] for e in served} <= {e["request_id"] for e in admitted}
    batches = {e["batch_id"] for e in events if e["event"] == "batch_emitted"}
    assert batches and {e["batch_id"] for e in served} <= batches
    # Three phases, each with admission, a scheduler, two workers and the gateway, each
    # stopped by SIGTERM.
    assert names["admission_stopped"] == names["scheduler_stopped"] == 3
    assert names["worker_stopped"] == 6
    assert names["gateway_started"] == names["gateway_stopped"] == 3
    paced = 2 * 2 + 2 * 2 + 2  # quiet-1, quiet-2 x 2; acme, searchco x 2; trial-1 x 2
    for name, phase in json.loads(figures_file.read_text())["phases"].items():
        assert phase["gateway"] == {"http_requests": paced, "http_statuses": {"200": paced},
                                    "ok_without_stamps": 0}, name
        assert phase["stages_p99_ms"]["HTTP to the gateway"] is not None, name
    assert "through the gateway: " in proc.stdout
    key = re.compile(r"sf-[A-Za-z0-9_-]{43}")
    assert not key.search(log_file.read_text()) and not key.search(proc.stdout + proc.stderr)
    print(f"{len(events)} log lines, {len(admitted)} admitted, {len(served)} served, "
          f"{len(batches)} batches; {proc.stdout.strip().splitlines()[-1]}")


def assert_verdict(proc: subprocess.CompletedProcess, figures: dict) -> None:
    """The demo's verdict: no phase left a request without its result, and its exit status,
    its failed list and its last line say what its own figures say.

    Whether the wall-clock checks (the bound, the stage limits, FIFO/DRR) hold is a claim
    about this machine, so it is the demo's to judge (``make demo``, docs/demo.md), not this
    test's; this test checks that the demo judges them from its figures and reports the
    outcome truthfully.
    """
    from app.demo import FIFO_OVER_DRR_MIN

    phases, checks, bound = figures["phases"], figures["checks"], figures["bound_ms"]
    assert phases and all(p["missing"] == 0 for p in phases.values()), phases
    for name, p in phases.items():
        assert checks[f"{name}: nothing missing"] is True
        within = checks.get(f"{name}: quiet p99 within the bound")
        if within is not None:  # a DRR phase under load
            limit = p.get("bound_ms", bound)  # the phase's own full batches, if served
            assert within == (p["quiet_p99_ms"] is not None and limit is not None
                              and p["quiet_p99_ms"] <= limit), (name, p, limit)
    ratio = figures.get("fifo_over_drr")
    fair = checks.get(f"fifo / drr >= {FIFO_OVER_DRR_MIN:.0f}x")
    assert fair is None or fair == (ratio is not None and ratio >= FIFO_OVER_DRR_MIN)
    assert [n for n, ok in checks.items() if not ok] == [
        n for n in figures["failed"] if n in checks], figures
    assert proc.returncode == (1 if figures["failed"] else 0), (proc.returncode, figures,
                                                                proc.stderr[-3000:])
    last = "some checks FAILED" if figures["failed"] else "all checks passed"
    assert last in proc.stdout, proc.stdout[-3000:]
