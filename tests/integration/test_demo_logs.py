"""``serving-fairness demo`` end to end as a process: its --log-file is JSON lines with the ids bound.

Slow (three phases, each on a fresh broker with the services as processes:
about a minute on two cores), so excluded by default; run it with
``pytest -m slow tests/integration/test_demo_logs.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_demo_log_file_is_json_lines_with_request_org_and_batch_ids(tmp_path: Path):
    """A small fake-model demo finishes its phases and every line of its log file is JSON;
    each request's admitted and served lines carry request_id and org, batches their
    batch_id, and every service process logs its totals when stopped."""
    log_file = tmp_path / "services.log"
    proc = subprocess.run(
        [sys.executable, "-m", "plumbing.cli", "demo", "--model", "fake", "--burst", "60",
         "--quiet", "2", "--skip-x5", "--timeout-s", "120", "--log-level", "debug",
         "--log-file", str(log_file)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        check=False,
        timeout=600)
    # Exit 1 means a fairness check failed (timings of a fake model on a
    # shared box); this test is about the logs, so only a crash counts.
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "checks" in proc.stdout, proc.stdout[-3000:]
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
    # Three phases, each with admission, a scheduler and two workers, each stopped by SIGTERM.
    assert names["admission_stopped"] == names["scheduler_stopped"] == 3
    assert names["worker_stopped"] == 6
    print(f"{len(events)} log lines, {len(admitted)} admitted, {len(served)} served, "
          f"{len(batches)} batches; {proc.stdout.strip().splitlines()[-1]}")
