"""The demo's verdict: every check it claims, each named when it fails."""

import argparse
import io
import json

from app.demo import Phase, Sent, _summary
from schemas.messages import Result

FULL_MS = 300.0


def _phase(name: str, policy: str, burst: int, latency_ms: float, *, missing: int = 0,
           admission_ms: float = 10.0, queue_ms: float = 50.0, t0_s: float = 1000.0) -> Phase:
    """Quiet orgs' requests that took ``latency_ms``, with stamps for each stage,
    one a second from ``t0_s`` (epoch s) for 40 s."""
    p = Phase(name, policy, burst)
    for i in range(40):
        sent_ms = t0_s * 1000 + i * 1000
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
    return [_phase("unloaded", "drr", 0, 60.0, t0_s=1000.0),
            _phase("burst 4000, drr", "drr", 4000, **drr, t0_s=2000.0),
            _phase("burst 20000, drr", "drr", 20000, **(overrides.pop("x5", {}) or drr),
                   t0_s=3000.0),
            _phase("burst 4000, fifo", "fifo", 4000, overrides.pop("fifo_ms", 12_000.0),
                   t0_s=4000.0)]


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


def _served(phase: Phase, ms: float, n: int, *, start_s: float = 0.0,
            span_s: float | None = None) -> list[tuple[float, float]]:
    """``n`` full batches of ``ms`` each, finished evenly over ``span_s`` seconds
    from ``start_s`` into ``phase`` (its whole traffic by default)."""
    t0, t1 = phase.wall_s
    span = t1 - t0 - start_s if span_s is None else span_s
    return [(t0 + start_s + span * (i + 1) / (n + 1), ms) for i in range(n)]


def _timed(phases: list[Phase]) -> list[Phase]:
    """Each phase's traffic (phases 1,000 s apart): 100 s from its first quiet
    request, the quiet requests' 40 s and 60 s of burst after them."""
    for i, p in enumerate(phases):
        p.wall_s = (1000.0 * (i + 1), 1000.0 * (i + 1) + 100)
    return phases


def test_the_bound_and_the_queue_limit_use_the_full_batches_a_phase_served():
    """Batches served at 400 ms in the 5x phase: its bound is unloaded + 2 x 400, not 2 x 300."""
    phases = _timed(_phases(x5={"latency_ms": 700.0, "queue_ms": 450.0}))
    out = io.StringIO()
    served = _served(phases[2], 400.0, 12) + _served(phases[1], 300.0, 12)
    assert _summary(phases, FULL_MS, argparse.Namespace(json=None), out, served) == 0, \
        out.getvalue()
    assert "full batch      400 ms (median of " in out.getvalue()
    # The same figures against the batch timed at start fail both checks.
    code, text = _run(phases)
    assert code == 1
    assert "burst 20000, drr: quiet p99 within the bound" in text.splitlines()[-1]
    assert "burst 20000, drr: scheduler-queue stage p99" in text.splitlines()[-1]


def test_too_few_served_full_batches_fall_back_to_the_start_timing():
    """Four batches served are not enough to judge by: the start's 300 ms stands."""
    phases = _timed(_phases(x5={"latency_ms": 700.0}))
    out = io.StringIO()
    assert _summary(phases, FULL_MS, argparse.Namespace(json=None), out,
                    _served(phases[2], 400.0, 4)) == 1
    assert "full batch      300 ms (timed at start)" in out.getvalue()


def test_served_full_batches_are_read_from_the_workers_events(tmp_path):
    """Only the endpoint's batch_served events of a full batch count; bad lines are passed over."""
    from app.demo import served_full_batches

    log = tmp_path / "services.log"
    def served(endpoint: str, tokens: int, model_ms: float, at: str) -> str:
        return json.dumps({"event": "batch_served", "endpoint": endpoint, "tokens": tokens,
                           "model_ms": model_ms, "seconds": 2 * model_ms / 1000,
                           "timestamp": f"2026-12-01T22:48:{at}Z"})

    log.write_text("\n".join([
        served("embed", 1000, 410.0, "23.946033"),
        served("embed", 100, 50.0, "24.000000"),   # not a full batch
        served("rerank", 1000, 200.0, "24.000000"),  # another endpoint
        served("embed", 1000, 400.0, "25")[:60],     # a line cut short
        'not json at all "batch_served"',
    ]))
    served = served_full_batches(log, "embed", 900)
    assert [round(ms) for _, ms in served] == [410]
    assert abs(served[0][0] - 1796165303.946033) < 1e-3
    assert served_full_batches(tmp_path / "absent.log", "embed", 900) == []


def test_the_full_batches_are_those_served_while_the_quiet_requests_were_out():
    """The 5x phase's batches took 400 ms while its quiet requests were out and
    300 ms in the minute after: the bound is unloaded + 2 x 400, the limit 500."""
    phases = _timed(_phases(x5={"latency_ms": 700.0, "queue_ms": 450.0}))
    during = _served(phases[2], 400.0, 8, span_s=40.0)
    after = _served(phases[2], 300.0, 30, start_s=42.0)
    out = io.StringIO()
    assert _summary(phases, FULL_MS, argparse.Namespace(json=None), out,
                    during + after) == 0, out.getvalue()
    assert "full batch      400 ms (median of 8 served while the quiet requests were out; " \
        "the phase's 38: 300 ms)" in out.getvalue()
    # Judged by the whole phase's median, the same run fails both checks.
    out = io.StringIO()
    few = during[:4] + after
    assert _summary(phases, FULL_MS, argparse.Namespace(json=None), out, few) == 1
    assert "full batch      300 ms (median of 34 served in the phase)" in out.getvalue()
    last = out.getvalue().splitlines()[-1]
    assert "burst 20000, drr: quiet p99 within the bound" in last
    assert "burst 20000, drr: scheduler-queue stage p99" in last


def test_a_phase_over_the_bound_says_where_its_late_requests_lost_their_time():
    """Every quiet request of the 5x burst 636 ms in inference (0 unloaded) and 50
    in the scheduler queue (as unloaded): the line puts the excess in inference."""
    code, text = _run(_phases(x5={"latency_ms": 700.0}))
    assert code == 1
    late = [line for line in text.splitlines() if "quiet over the bound" in line]
    assert len(late) == 1, text
    assert "40 requests over it" in late[0]
    assert "inference 25,440 ms (100 %)" in late[0]
    assert "scheduler queue" not in late[0]


def test_no_late_line_while_every_phase_is_within_the_bound():
    code, text = _run(_phases())
    assert code == 0
    assert "quiet over the bound" not in text


def test_the_http_hop_is_a_stage_of_its_own_when_the_quiet_orgs_took_it():
    """Sent over HTTP 5 ms before the gateway stamped created_ms: the stage table's first
    row is that hop (5 ms at p99), and the JSON figures carry it; without a send stamp, no row."""
    phases = _phases()
    for p in phases:
        for s in p.sent.values():
            if s.result is not None:
                s.sent_ms = s.result.created_ms - 5.0
    code, text = _run(phases)
    assert code == 0, text
    table = text.split("per stage ==\n", 1)[1].splitlines()
    assert table[1].split()[:4] == ["HTTP", "to", "the", "gateway"]
    assert table[1].split()[4:] == ["5"] * 4
    assert table[2].startswith("to admission")
    code, text = _run(_phases())
    assert "HTTP to the gateway" not in text


def test_the_late_line_says_what_the_http_hop_added():
    """Late requests 25 ms on their way to the gateway, 5 ms unloaded: 20 ms a request beyond."""
    phases = _phases(x5={"latency_ms": 700.0})
    for p in phases:
        for s in p.sent.values():
            if s.result is not None:
                s.sent_ms = s.result.created_ms - (25.0 if p is phases[2] else 5.0)
    code, text = _run(phases)
    assert code == 1
    late = [line for line in text.splitlines() if "quiet over the bound" in line]
    assert late[0].endswith("; HTTP to the gateway beyond its unloaded p50: 20 ms a request")
