"""The simulator: accounting, and the fairness claims on a virtual clock (deterministic)."""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

import pytest

from schemas.build import build_config
from schemas.config import load_config
from traffic.report import percentile
from traffic.simulate import (
    PipelineAdmission,
    ServiceModel,
    SimResult,
    SimSettings,
    add_arguments,
    jain,
    run,
    simulate,
)
from traffic.trace import TraceRecord, backlogged, noisy_neighbour

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = load_config(EXAMPLES / "config.toml")
WEIGHTED = load_config(EXAMPLES / "weighted.toml")
SERVICE = ServiceModel()  # 5 ms + 0.28 ms/token
FULL_BATCH_S = SERVICE.batch_s(CONFIG.endpoints["embed"].max_batch_tokens)
VICTIM = "quiet-1"


@cache
def noisy(burst: int, policy: str) -> SimResult:
    return simulate(CONFIG, noisy_neighbour(burst), SimSettings(policy=policy))


def p99_ms(result: SimResult, org: str) -> float:
    xs = sorted(o.latency_s * 1000 for o in result.outcomes if o.org == org and o.status == "ok")
    return percentile(xs, 99)


def alone_p99_ms() -> float:
    return p99_ms(noisy(0, "drr"), VICTIM)


def test_jain_index_formula():
    """Jain's index is 1 for equal shares and 1/n when one org gets everything."""
    assert jain([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([1.0, 2.0]) == pytest.approx(9 / 10)


def test_every_request_leaves_exactly_once():
    """Each request ends as exactly one outcome: ok, rejected, expired or invalid."""
    recs = noisy_neighbour(3000, quiet_orgs=["quiet-2", "acme", "trial-1"])
    extra = [
        # trial-1 (tier free) is backlogged behind the burst: not an express batch's org.
        TraceRecord(ts=0.2 + i / 100, org="trial-1", endpoint="embed", tokens=128,
                    deadline_ms=400, id=f"dl-{i}") for i in range(20)
    ] + [
        TraceRecord(ts=0.3, org="nobody", endpoint="embed", tokens=8, id="unknown-org"),
        TraceRecord(ts=0.3, org="acme", endpoint="nope", tokens=8, id="unknown-endpoint"),
        TraceRecord(ts=0.3, org="searchco", endpoint="embed", tokens=5000, id="too-big"),
        TraceRecord(ts=0.3, org="trial-1", endpoint="embed", tokens=8, priority=9, id="too-high"),
    ] + [
        TraceRecord(ts=i / 20, org="trial-1", endpoint="embed", tokens=512, id=f"free-{i}")
        for i in range(300)
    ] + [
        TraceRecord(ts=i / 50, org="acme", endpoint="rerank", tokens=300, id=f"rr-{i}")
        for i in range(200)
    ]
    recs = sorted(recs + extra, key=lambda r: r.ts)
    res = simulate(CONFIG, recs, SimSettings(workers=2, slots=2,
                                             admission=PipelineAdmission(CONFIG)))
    ids = [o.id for o in res.outcomes]
    assert sorted(ids) == sorted(r.id for r in recs)
    status = {o.id: o for o in res.outcomes}
    assert {status[i].reason for i in ("unknown-org", "unknown-endpoint", "too-big",
                                       "too-high")} == {"unknown_org", "unknown_endpoint",
                                                        "too_many_tokens", "priority_above_cap"}
    kinds = {o.status for o in res.outcomes}
    assert {"ok", "expired", "invalid", "rejected"} <= kinds
    for o in res.outcomes:
        if o.status == "ok":
            assert o.arrival_s <= o.dispatched_s < o.completed_s
            assert o.batch_tokens <= o.batch_budget
        else:
            assert o.dispatched_s is None and o.batch_id is None
        if o.status == "expired":
            assert o.completed_s >= o.arrival_s + 0.4 - 1e-9
    s = res.summary()
    t = s["totals"]
    assert t["requests"] == len(recs) == sum(t[k] for k in ("completed", "rejected", "expired",
                                                            "invalid", "failed", "missing"))


def test_work_conserving_no_idle_gap_while_backlogged():
    """With everything queued at t=0 the worker never idles: makespan = sum of batch times."""
    res = simulate(WEIGHTED, backlogged(["weight-1", "weight-2"], 500))
    batches = {o.batch_id: o.batch_tokens for o in res.outcomes}
    busy = sum(SERVICE.batch_s(t) for t in batches.values())
    assert max(o.completed_s for o in res.outcomes) == pytest.approx(busy)


def test_slots_bound_batches_in_hand():
    """A worker holds at most ``slots`` batches: service intervals of one worker never overlap."""
    res = simulate(WEIGHTED, backlogged(["weight-1"], 300), SimSettings(workers=1, slots=2))
    spans = sorted({(o.dispatched_s, o.completed_s) for o in res.outcomes})
    # Batch k+2 is chosen only once batch k is done (two in hand at most).
    for a, b in zip(spans, spans[2:], strict=False):  # each span and the one two later
        assert b[0] >= a[1] - 1e-9


# -- the noisy neighbour -------------------------------------------------------


def test_noisy_neighbour_victim_bounded_under_drr():
    """B's p99 under DRR stays within its idle-system p99 + two full-batch service times."""
    bound = alone_p99_ms() + 2 * FULL_BATCH_S * 1000
    for burst in (1_000, 10_000, 20_000):
        assert p99_ms(noisy(burst, "drr"), VICTIM) <= bound


def test_noisy_neighbour_victim_does_not_grow_with_burst():
    """Growing A's burst 1,000 -> 20,000 does not move B's p99 under DRR (1% margin)."""
    small, big = p99_ms(noisy(1_000, "drr"), VICTIM), p99_ms(noisy(20_000, "drr"), VICTIM)
    assert big <= small * 1.01


def test_noisy_neighbour_fifo_grows_with_burst():
    """Under FIFO, B waits behind the burst: its p99 grows with it, >= 50x DRR at 10,000."""
    f1, f10, f20 = (p99_ms(noisy(b, "fifo"), VICTIM) for b in (1_000, 10_000, 20_000))
    assert f1 < f10 < f20
    assert f20 >= 15 * f1
    assert f10 >= 50 * p99_ms(noisy(10_000, "drr"), VICTIM)


def test_noisy_neighbour_jain():
    """DRR: no two orgs wait together (index n/a); FIFO: B waits, served nothing (0.5)."""
    assert noisy(10_000, "drr").summary()["jain_index"] is None
    assert noisy(10_000, "fifo").summary()["jain_index"] == pytest.approx(0.5)


def test_throughput_drr_at_least_98_percent_of_fifo():
    """Fairness costs no throughput: DRR serves >= 98% of FIFO's requests per second."""
    for drr, fifo in (
        (noisy(10_000, "drr"), noisy(10_000, "fifo")),
        (simulate(WEIGHTED, backlogged(["weight-1", "weight-3"], 1_000)),
         simulate(WEIGHTED, backlogged(["weight-1", "weight-3"], 1_000),
                  SimSettings(policy="fifo"))),
    ):
        assert drr.summary()["throughput_rps"] >= 0.98 * fifo.summary()["throughput_rps"]


# -- backlogged orgs -----------------------------------------------------------


def test_backlogged_equal_weights_jain():
    """Four equal-weight orgs, all backlogged: Jain's index on served cost >= 0.99."""
    orgs = ["bulkcorp", "quiet-1", "quiet-2", "searchco"]
    res = simulate(CONFIG, backlogged(orgs, 1_000))
    g = res.main_group
    assert set(g.orgs) == set(orgs) and g.batches > 20
    assert res.summary()["jain_index"] >= 0.99


def test_backlogged_weights_proportional():
    """Weights 1:2:3:4, all backlogged: served cost within 5% of the weight shares."""
    res = simulate(WEIGHTED, backlogged(["weight-1", "weight-2", "weight-3", "weight-4"], 2_000))
    g = res.main_group
    assert len(g.orgs) == 4
    total = sum(g.served.values())
    for org in g.orgs:
        want = WEIGHTED.orgs[org].weight / 10
        assert g.served[org] / total == pytest.approx(want, rel=0.05)
    assert res.summary()["jain_index"] >= 0.99


def test_tiers_strict_in_simulation():
    """An enterprise org's requests overtake a standard burst: served in the next batch."""
    recs = noisy_neighbour(2_000, victim="acme")
    res = simulate(CONFIG, recs)
    assert p99_ms(res, "acme") <= 2 * FULL_BATCH_S * 1000 + 50


def test_adaptive_cost_learns_from_feedback():
    """Rerank (adaptive cost): a request costs its tokens until feedback comes; then the org of
    short requests pays more per token than the org of long ones (the batch overhead)."""
    recs = [TraceRecord(ts=i / 5, org=org, endpoint="rerank", tokens=tokens, id=f"{org}-{i}")
            for i in range(60) for org, tokens in (("quiet-1", 20), ("quiet-2", 400))]
    res = simulate(CONFIG, sorted(recs, key=lambda r: r.ts))
    assert all(o.status == "ok" for o in res.outcomes)
    served = sorted(res.outcomes, key=lambda o: o.dispatched_s)
    first = [o for o in served if o.dispatched_s == served[0].dispatched_s]
    assert all(o.cost == o.tokens for o in first), "a cost before any feedback"
    late = served[len(served) // 2:]
    per_token = {org: [o.cost / o.tokens for o in late if o.org == org]
                 for org in ("quiet-1", "quiet-2")}
    assert min(per_token["quiet-1"]) > 1 > max(per_token["quiet-2"])
    assert min(per_token["quiet-1"]) >= 1.2 * max(per_token["quiet-2"])


def test_feedback_splits_the_batch_overhead_per_request():
    """Each request's fed-back time: the overhead shared evenly, then its own tokens."""
    model = ServiceModel(overhead_ms=6.0, ms_per_token=0.5)
    shares = model.shares_s([10, 100, 2])
    assert shares == pytest.approx([(2 + 5) / 1000, (2 + 50) / 1000, (2 + 1) / 1000])
    assert sum(shares) == pytest.approx(model.batch_s(112))


# -- admission -----------------------------------------------------------------


def test_rate_limits_reject_the_burst_not_the_victim():
    """With admission on, bulkcorp's 20,000/s limit rejects its excess; B is never rejected."""
    res = simulate(CONFIG, noisy_neighbour(30_000), SimSettings(admission=PipelineAdmission(
        CONFIG, throttle=False)))
    s = res.summary()
    a = s["orgs"]["bulkcorp"]
    assert 20_000 <= a["completed"] <= 21_500 and a["rejected"] == 30_000 - a["completed"]
    assert s["rejections"] == {"rejected: rate_limited": a["rejected"]}
    assert s["orgs"][VICTIM]["rejected"] == 0 and s["orgs"][VICTIM]["completed"] == 5


def test_overload_rejects_beyond_max_held():
    """``max_held_requests`` caps what the scheduler holds: the rest is ``overloaded``."""
    cfg = build_config(base=(EXAMPLES / "config.toml").read_text(), max_held_requests=500).config
    res = simulate(cfg, noisy_neighbour(2_000), SimSettings(admission=PipelineAdmission(
        cfg, rate_limits=False, throttle=False)))
    reasons = {o.reason for o in res.outcomes if o.status == "rejected"}
    assert reasons == {"overloaded"}


# -- command line --------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_cli_json_has_the_documented_keys(tmp_path, capsys):
    """``simulate --json`` writes per-org counts and latencies, throughput and Jain's index."""
    trace = tmp_path / "t.jsonl"
    from traffic.trace import write_trace

    write_trace(trace, noisy_neighbour(500))
    out = tmp_path / "s.json"
    assert run(parse("--config", str(EXAMPLES / "config.toml"), "--trace", str(trace),
                     "--policy", "fifo", "--json", str(out))) == 0
    s = json.loads(out.read_text())
    for org in ("bulkcorp", VICTIM):
        row = s["orgs"][org]
        for k in ("requests", "completed", "rejected", "expired", "served_cost"):
            assert k in row
        assert set(row["latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert s["orgs"][VICTIM]["requests"] == 5
    assert "throughput_rps" in s and "jain_index" in s and s["meta"]["policy"] == "fifo"
    printed = capsys.readouterr().out
    assert "bulkcorp" in printed and "p99 ms" in printed


def test_express_batches_take_the_victims_wait_down_and_the_flag_leaves_them_out(tmp_path):
    """As live: with every slot taken, the quiet org's request goes out at once and runs
    after the batch in progress (scheduler/dispatch.py). Its p99 falls from two full
    batches to about one, with the fresh requests alone (the default) as with a
    top-up to a quarter of a batch (``--express-fill 0.25``: the fresh requests in a call
    of their own first, as the live worker runs them); ``--no-express`` gives the scheduler without
    them. Nothing else changes: the burst is served in the same time, and FIFO takes
    no express batch."""
    from traffic.trace import write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, noisy_neighbour(10_000))
    got = {}
    for name, flag in (("fill", ["--express-fill", "0.25"]), ("alone", []),
                       ("off", ["--no-express"])):
        out = tmp_path / f"{name}.json"
        assert run(parse("--config", str(EXAMPLES / "config.toml"), "--trace", str(trace),
                         "--json", str(out), *flag)) == 0
        got[name] = json.loads(out.read_text())
    assert got["fill"]["meta"]["express"] is True and got["off"]["meta"]["express"] is False
    assert got["fill"]["meta"]["express_fill"] == 0.25
    assert got["alone"]["meta"]["express_fill"] == 0.0
    p99 = {k: v["orgs"][VICTIM]["latency_ms"]["p99"] for k, v in got.items()}
    full_ms = FULL_BATCH_S * 1000
    assert p99["off"] > 1.8 * full_ms                  # no express: about two full batches
    assert p99["alone"] < 1.2 * full_ms                # the fresh request alone: about one
    assert p99["fill"] < 1.2 * full_ms                 # topped up to a quarter: as much
    completed = {k: v["orgs"]["bulkcorp"]["completed"] for k, v in got.items()}
    assert completed["fill"] == completed["alone"] == completed["off"]
    fifo = [simulate(CONFIG, noisy_neighbour(1_000), SimSettings(policy="fifo", express=e))
            for e in (True, False)]
    assert [o.completed_s for o in fifo[0].outcomes] == [o.completed_s for o in fifo[1].outcomes]


def test_an_express_horizon_holds_express_batches_back_while_the_batch_in_hand_ends_soon():
    """One slot: what a worker holds ends within one full batch, so at a horizon of 1 no
    express batch goes out and the victim's request goes first in the next regular batch
    (about two full batches at p99, as without express batches); at 0.3 the batch in hand
    often ends later than that, and express batches go out again."""
    records = noisy_neighbour(10_000)
    runs = {h: simulate(CONFIG, records, SimSettings(express_horizon=h)) for h in (0.0, 0.3, 1.0)}
    express = {h: sum(o.express for o in r.outcomes) for h, r in runs.items()}
    assert express[1.0] == 0 and express[0.3] > 0 and express[0.0] >= express[0.3]
    assert runs[1.0].meta["express_horizon"] == 1.0
    assert p99_ms(runs[1.0], VICTIM) < 2.2 * FULL_BATCH_S * 1000
    assert p99_ms(runs[0.0], VICTIM) < 1.2 * FULL_BATCH_S * 1000
    served = {h: sorted(o.id for o in r.outcomes if o.status == "ok") for h, r in runs.items()}
    assert served[0.0] == served[0.3] == served[1.0]            # the same requests
    assert len(set(served[1.0])) == len(served[1.0]) > 0         # each once
    with pytest.raises(ValueError, match="express_horizon"):
        simulate(CONFIG, records[:10], SimSettings(express_horizon=float("nan")))


def test_cli_reports_bad_trace(tmp_path, capsys):
    """A bad trace line is a clear error and exit code 2, not a traceback."""
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"ts": 0, "org": "a", "endpoint": "embed"}\n')
    assert run(parse("--config", str(EXAMPLES / "config.toml"), "--trace", str(trace))) == 2
    assert "bad.jsonl:1: field `tokens`" in capsys.readouterr().err


def test_an_express_batchs_fresh_requests_end_with_its_head_call_not_its_top_up():
    """Uncalibrated, an express batch is two calls as the worker plans it: its fresh
    requests are done when the first ends. Topped up to a full batch, the victim's
    request then waits for the batch in progress and its head call (about one full
    batch), not also for its top-up (about two)."""
    res = simulate(CONFIG, noisy_neighbour(2_000), SimSettings(express_fill=1.0))
    express = [o for o in res.outcomes if o.express and o.org == VICTIM]
    assert express, "no express batch carried the victim"
    assert p99_ms(res, VICTIM) < 1.2 * FULL_BATCH_S * 1000
    # And the top-up behind it ends later than the head, in the same batch.
    batch = express[0].batch_id
    ends = {o.org: o.completed_s for o in res.outcomes if o.batch_id == batch}
    assert ends["bulkcorp"] > ends[VICTIM]


def test_queue_samples_track_the_backlog():
    """Queue depth is sampled on the virtual clock: it peaks with the burst and ends empty."""
    res = noisy(1_000, "drr")
    embed = [s for s in res.samples if s.endpoint == "embed"]
    times = [s.t_s for s in embed]
    assert times == sorted(times) and max(times) == pytest.approx(
        max(o.completed_s for o in res.outcomes))
    assert max(s.held_by_tier["standard"] for s in embed) > 900
    assert embed[-1].held_tokens_by_tier["standard"] == 0
