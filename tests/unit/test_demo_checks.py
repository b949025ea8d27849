"""The demo's verdict: every check it claims, each named when it fails."""

import argparse
import io

from app.demo import Phase, Sent, _summary
from schemas.messages import Result

FULL_MS = 300.0


def _phase(name: str, policy: str, burst: int, latency_ms: float, *, missing: int = 0,
           admission_ms: float = 10.0, queue_ms: float = 50.0) -> Phase:
    """Quiet orgs' requests that took ``latency_ms``, with stamps for each stage."""
    p = Phase(name, policy, burst)
    for i in range(40):
        sent_ms = 1_000_000.0 + i * 1000
        r = Result(id=f"{name}-{i}", status="ok", org="quiet-1", endpoint="embed",
                   created_ms=int(sent_ms), fetched_ms=int(sent_ms + 1),
                   admitted_ms=int(sent_ms + admission_ms),
                   received_ms=int(sent_ms + admission_ms + 1),
                   dispatched_ms=int(sent_ms + admission_ms + 1 + queue_ms),
                   taken_ms=int(sent_ms + admission_ms + queue_ms + 2),
                   started_ms=int(sent_ms + admission_ms + queue_ms + 3),
                   completed_ms=int(sent_ms + latency_ms - 1))
        p.sent[r.id] = Sent("quiet-1", "standard", "embed", sent_ms / 1000, r,
                            (sent_ms + latency_ms) / 1000, sent_ms + latency_ms)
    for i in range(missing):
        p.sent[f"{name}-lost-{i}"] = Sent("quiet-2", "standard", "embed", 0.0)
    return p


def _run(phases: list[Phase]) -> tuple[int, str]:
    out = io.StringIO()
    code = _summary(phases, FULL_MS, argparse.Namespace(json=None), out)
    return code, out.getvalue()


def _phases(**overrides) -> list[Phase]:
    """Unloaded 60 ms, both bursts within 660 ms, FIFO 30 x worse: every check holds."""
    drr = {"latency_ms": 400.0} | overrides.pop("drr", {})
    return [_phase("unloaded", "drr", 0, 60.0),
            _phase("burst 4000, drr", "drr", 4000, **drr),
            _phase("burst 20000, drr", "drr", 20000, **(overrides.pop("x5", {}) or drr)),
            _phase("burst 4000, fifo", "fifo", 4000, overrides.pop("fifo_ms", 12_000.0))]


def test_all_checks_pass_when_every_promise_holds():
    """Within the bound, nothing missing, fast stages, FIFO 30x: exit 0."""
    code, text = _run(_phases())
    assert code == 0, text
    assert "all checks passed" in text


def test_a_phase_over_the_bound_fails_and_is_named():
    """The 5x burst over unloaded p99 + 2 full batches: exit 1, the phase named."""
    code, text = _run(_phases(x5={"latency_ms": 700.0}))
    assert code == 1
    assert "burst 20000, drr: quiet p99 within the bound" in text.splitlines()[-1]


def test_fifo_less_than_twenty_times_worse_fails():
    """FIFO only 10x the DRR p99: the demo does not claim isolation it did not show."""
    code, text = _run(_phases(fifo_ms=4_000.0))
    assert code == 1
    assert "fifo / drr >= 20x" in text.splitlines()[-1]


def test_a_missing_result_fails():
    """A request without a result in any phase fails the run."""
    phases = _phases()
    phases[3] = _phase("burst 4000, fifo", "fifo", 4000, 12_000.0, missing=1)
    code, text = _run(phases)
    assert code == 1
    assert "burst 4000, fifo: nothing missing" in text.splitlines()[-1]


def test_slow_admission_or_queue_stage_fails():
    """Admission p99 over 100 ms, or the scheduler queue over a batch + 100 ms: named."""
    code, text = _run(_phases(drr={"latency_ms": 400.0, "admission_ms": 150.0}))
    assert code == 1 and "admission stage p99 <= 100 ms" in text.splitlines()[-1]
    code, text = _run(_phases(drr={"latency_ms": 600.0, "queue_ms": 450.0}))
    assert code == 1 and "scheduler-queue stage p99" in text.splitlines()[-1]
