"""Calibration: the fit recovers the model a run was made with, and simulating with it reproduces the run."""

from __future__ import annotations

import argparse
import json

import msgspec
import pytest

from scheduler.entry import Entry
from schemas.build import build_config
from schemas.messages import Result
from traffic import calibrate as cal
from traffic.calibrate import CalibratedPipeline, Calibration, EndpointFit, Figure
from traffic.report import percentile
from traffic.simulate import ServiceModel, SimSettings, add_arguments, run, simulate
from traffic.trace import TraceRecord

#: One tier, two orgs; the model as the loader defaults it (the simulator loads none).
BUILT = build_config(worker_slots=2, tiers=["standard"],
                     orgs={"bulk": "standard", "quiet": "standard"},
                     endpoints={"embed": {"model": None, "quantum": 512, "max_batch_tokens": 1024,
                                          "max_batch_size": 64, "max_request_tokens": 64}})
CONFIG = BUILT.config

TRUTH = {"batch_overhead_ms": 20.0, "micro_overhead_ms": 10.0, "ms_per_padded_token": 0.3,
         "admission_ms": 100.0, "admission_rate_rps": 2000.0, "delivery_ms": 15.0,
         "feedback_ms": 25.0}


def truth() -> Calibration:
    f = {k: Figure(v, 1) for k, v in TRUTH.items()}
    ep = EndpointFit(endpoint="embed", batches=0, busy_batches=0, batch_predicted_ms=0,
                     batch_measured_ms=0, batch_error_ms=0, microbatch_size=16,
                     microbatch_tokens=4096, micro_gap_ms=Figure(0.0, 0), **f)
    return Calibration({"embed": ep})


def trace() -> list[TraceRecord]:
    """bulk: 600 requests of 8..64 tokens in the first 0.06 s; quiet: one every 0.25 s, and
    then, once the burst is over, alone on idle workers."""
    recs = [TraceRecord(ts=i * 0.0001, org="bulk", endpoint="embed", tokens=8 + (i * 7) % 57,
                        id=f"b{i}") for i in range(600)]
    recs += [TraceRecord(ts=0.05 + 0.25 * i, org="quiet", endpoint="embed", tokens=12,
                         id=f"q{i}") for i in range(12)]
    recs += [TraceRecord(ts=30.0 + i, org="quiet", endpoint="embed", tokens=12, id=f"late{i}")
             for i in range(4)]
    return sorted(recs, key=lambda r: r.ts)


def run_with(calibration: Calibration):
    """Without express batches: with them a quiet request's latency turns on the phase of
    its arrival against the batches in hand (whether its worker already holds an express
    batch), so a fit 0.2 ms off moves single requests by a batch (p50 0.55 against 0.61
    s here), while every fitted figure is as close as without them."""
    pipeline = CalibratedPipeline(calibration, CONFIG, ServiceModel())
    return simulate(CONFIG, trace(), SimSettings(slots=2, pipeline=pipeline, express=False))


def observations(outcomes) -> list[cal.Observation]:
    """A simulated run's outcomes as a live run's results would give them."""
    return [cal.Observation(org=o.org, endpoint=o.endpoint, tokens=o.tokens,
                            sent_ms=o.arrival_s * 1000, admitted_ms=o.admitted_s * 1000,
                            dispatched_ms=o.dispatched_s * 1000,
                            completed_ms=o.completed_s * 1000, batch_id=o.batch_id,
                            worker="w")
            for o in outcomes if o.status == "ok"]


def test_the_fit_recovers_the_model_a_run_was_made_with():
    """Every fitted parameter of a simulated run equals the one it was simulated with."""
    sim = run_with(truth())
    got = cal.fit(observations(sim.outcomes), microbatch_size=16).endpoints["embed"]
    assert got.busy_batches > 10
    for name, want in TRUTH.items():
        value = getattr(got, name).value
        assert value == pytest.approx(want, rel=0.02, abs=0.5), (name, getattr(got, name))
    assert got.batch_predicted_ms == pytest.approx(got.batch_measured_ms, rel=1e-6)
    assert got.batch_error_ms == pytest.approx(0, abs=0.5)


def test_simulating_with_the_fit_reproduces_the_quiet_orgs_latency():
    """Calibrated from a run, the simulation gives the quiet org's p50 and p99 within 2 %."""
    first = run_with(truth())
    refit = cal.fit(observations(first.outcomes), microbatch_size=16)
    second = run_with(refit)

    def quiet(result):
        xs = sorted(o.latency_s for o in result.outcomes if o.org == "quiet" and o.latency_s)
        return percentile(xs, 50), percentile(xs, 99)

    (p50a, p99a), (p50b, p99b) = quiet(first), quiet(second)
    assert p50b == pytest.approx(p50a, rel=0.02) and p99b == pytest.approx(p99a, rel=0.02)


def test_without_the_pipeline_the_simulator_is_unchanged():
    """No pipeline: arrivals at their ts, a batch's requests all done at its end (an
    express batch's fresh requests at its first call's end), no hops."""
    sim = simulate(CONFIG, trace(), SimSettings(slots=2))
    for o in sim.outcomes:
        assert o.admitted_s == o.arrival_s
    ends: dict[tuple[str | None, bool], set[float]] = {}
    for o in sim.outcomes:
        ends.setdefault((o.batch_id, o.express), set()).add(o.completed_s)
    assert all(len(v) <= (2 if express else 1) for (_, express), v in ends.items())
    assert any(not express for _, express in ends)


def test_a_replay_report_is_read_from_its_results(tmp_path):
    """results.jsonl (one Result a line) gives one observation per ok result with its stamps."""
    enc = msgspec.json.Encoder()
    rows = [Result(id="a", status="ok", org="quiet", endpoint="embed", tokens=10,
                   truncated=[False, False], batch_id="b1", worker="w1", created_ms=1000,
                   admitted_ms=1100, dispatched_ms=1200, completed_ms=1500, inference_ms=3.0),
            Result(id="b", status="rejected", org="bulk", endpoint="embed")]
    (tmp_path / "results.jsonl").write_bytes(b"".join(enc.encode(r) + b"\n" for r in rows))
    [o] = cal.observations_from_report(tmp_path)
    assert (o.texts, o.sent_ms, o.completed_ms, o.worker, o.inference_ms) == (2, 1000, 1500,
                                                                              "w1", 3.0)
    with pytest.raises(FileNotFoundError):
        cal.observations_from_report(tmp_path / "nothing")


def test_simulate_calibrate_prints_the_fit_and_runs_with_it(tmp_path, capsys):
    """`simulate --calibrate DIR` prints each fitted parameter, then the calibrated run."""
    sim = run_with(truth())
    report = tmp_path / "live"
    report.mkdir()
    with (report / "outcomes.jsonl").open("w") as f:
        for o in sim.outcomes:
            f.write(json.dumps(msgspec.to_builtins(o)) + "\n")
    config = tmp_path / "config.toml"
    config.write_text(BUILT.text)
    tr = tmp_path / "trace.jsonl"
    tr.write_text("".join(json.dumps({"ts": r.ts, "org": r.org, "endpoint": r.endpoint,
                                      "tokens": r.tokens, "id": r.id}) + "\n" for r in trace()))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out_json = tmp_path / "sim.json"
    args = parser.parse_args(["--config", str(config), "--trace", str(tr), "--calibrate",
                              str(report), "--microbatch-size", "16", "--json", str(out_json)])
    assert run(args) == 0
    text = capsys.readouterr().out
    for label in ("batch overhead ms", "ms per padded token", "admission delay ms",
                  "delivery ms", "feedback ms", "2 slot(s)", "the calibrated model"):
        assert label in text
    meta = json.loads(out_json.read_text())["meta"]
    fitted = meta["calibration"]["endpoints"]["embed"]
    assert fitted["feedback_ms"]["value"] == pytest.approx(25.0, rel=0.02)
    bad = parser.parse_args(["--config", str(config), "--trace", str(tr), "--calibrate",
                             str(tmp_path / "missing")])
    assert run(bad) == 2


def stamped(n_batches: int = 30, *, a=4.0, per=0.5, gap=3.0, head=7.0, delivery=12.0):
    """Results of back-to-back batches on one worker, with every stamp a current worker writes."""
    out, t_end = [], 0.0
    for b in range(n_batches):
        dispatched = 1000.0 + 40.0 * b
        taken = dispatched + delivery
        t = max(taken, t_end) + head
        sizes = [(8, 20), (8, 20), (4, 10 + b % 5)]  # micro-batches: (texts, tokens each)
        for k, (count, tokens) in enumerate(sizes):
            if k:
                t += gap
            start = t
            t += a + per * count * tokens
            for i in range(count):
                out.append(Result(id=f"r{b}-{k}-{i}", status="ok", org="bulk", endpoint="embed",
                                  tokens=tokens, batch_id=f"b{b}", worker="w", created_ms=900,
                                  admitted_ms=950, received_ms=960, dispatched_ms=int(dispatched),
                                  taken_ms=int(taken), started_ms=int(start),
                                  completed_ms=int(t)))
        t_end = t
    return out


def test_with_the_workers_stamps_each_part_is_measured_on_its_own():
    """started_ms, taken_ms and received_ms give micro-batches, delivery and admission directly."""
    f = cal.fit(cal.observations_from_results(stamped())).endpoints["embed"]
    assert f.stamped
    # Stamps are whole milliseconds: within a millisecond of the truth.
    assert f.ms_per_padded_token.value == pytest.approx(0.5, abs=0.01)
    assert f.micro_overhead_ms.value == pytest.approx(4.0, abs=1.0)
    assert f.micro_gap_ms.value == pytest.approx(3.0, abs=1.0)
    assert f.batch_overhead_ms.value == pytest.approx(7.0, abs=1.0)
    assert f.delivery_ms.value == pytest.approx(12.0, abs=1.0)
    assert f.admission_ms.value == pytest.approx(60.0, abs=1.0)  # sent -> read by the scheduler
    assert f.batch_predicted_ms == pytest.approx(f.batch_measured_ms, rel=0.02)


def _line_by_hand(points):
    """The least-squares fit _line computed by hand before it used the standard library."""
    if not points:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    if sxx <= 0 or a < 0 or b <= 0:
        sx2 = sum(x * x for x, _ in points)
        b, a = (sum(x * y for x, y in points) / sx2 if sx2 else 0.0), 0.0
    return a, b


@pytest.mark.parametrize("points", [
    [],
    [(64.0, 12.0)],                                   # one point: through the origin
    [(0.0, 3.0)],                                     # one point at x = 0: no slope
    [(32.0, 5.0), (32.0, 7.0), (32.0, 6.5)],          # one shape: all per token
    [(0.0, 1.0), (0.0, 2.0)],                         # every x 0
    [(16.0, 4.1), (64.0, 9.8), (256.0, 31.0), (512.0, 60.5), (128.0, 17.2)],  # a + b x
    [(16.0, 1.0), (64.0, 9.0), (256.0, 40.0)],        # negative intercept: refitted
    [(16.0, 9.0), (64.0, 5.0), (256.0, 1.0)],         # falling: refitted through 0
    [(float(x), 2.5 + 0.031 * x + (x % 7) * 0.4) for x in range(8, 4096, 37)],
])
def test_the_fit_is_the_one_computed_by_hand(points):
    """statistics.linear_regression gives the intercept and slope the hand-written fit gave."""
    got, want = cal._line(points), _line_by_hand(points)
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("stamped", "calls"), [(False, 1), (True, 2)])
def test_a_stamped_fit_cuts_batches_where_the_worker_cuts_them(stamped, calls):
    """Three requests of 4 tokens and one of 60, a call worth 10 / 0.3 = 33 tokens: a fit
    from start stamps (a worker that learns its cut) runs the long one apart; a fit from
    ends alone (an older worker) fills one call."""
    f = {k: Figure(v, 1) for k, v in TRUTH.items()}
    ep = EndpointFit(endpoint="embed", batches=0, busy_batches=0, batch_predicted_ms=0,
                     batch_measured_ms=0, batch_error_ms=0, microbatch_size=16,
                     microbatch_tokens=4096, micro_gap_ms=Figure(0.0, 0), stamped=stamped, **f)
    pipeline = CalibratedPipeline(Calibration({"embed": ep}), CONFIG, ServiceModel())
    entries = [Entry(id=f"r{i}", org="bulk", tier="standard", tokens=t)
               for i, t in enumerate([4, 4, 4, 60])]
    took, done, _ = pipeline.serve("embed", entries)
    # Each call: 10 ms + 0.3 ms a padded token, after the batch's 20 ms.
    want = (20 + 10 + 0.3 * 4 * 60) if calls == 1 else (20 + 10 + 0.3 * 12 + 10 + 0.3 * 60)
    assert took * 1000 == pytest.approx(want)
    assert len(set(done)) == calls
