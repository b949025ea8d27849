"""Replay results to report outcomes: every request accounted for, live Jain's index."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.config import load_config
from schemas.messages import EmbedInput, Request, Result
from traffic.replay_outcomes import (
    late_requests,
    live_jain,
    outcomes_of,
    peak_per_s,
    results_ms,
    sent_after,
    sent_line,
)
from traffic.replay_sources import ReplayItem
from traffic.report import Outcome
from traffic.stages import request_stages

CONFIG = load_config(Path(__file__).resolve().parents[2] / "examples" / "config.toml")
WALL0 = 1_700_000_000.0


def item(i: int, org: str = "quiet-1", tokens: int = 10) -> ReplayItem:
    req = Request(id=f"orig-{i}", org=org, endpoint="embed", input=EmbedInput(texts=("x",)))
    return ReplayItem(ts=i * 0.1, request=req, tokens=tokens)


def ms(t: float) -> int:
    return int((WALL0 + t) * 1000)


def test_each_item_one_outcome_whatever_came_back():
    """ok, rejected, a refused send and no answer at all each give one outcome, in item order."""
    items = [item(i) for i in range(5)]
    sent = [WALL0 + i * 0.1 for i in range(5)]
    ok = Result(id="w-0", status="ok", org="quiet-1", endpoint="embed", tokens=10,
                batch_id="b1", admitted_ms=ms(0.01), dispatched_ms=ms(0.02),
                completed_ms=ms(0.05))
    ok2 = Result(id="w-1", status="ok", org="quiet-1", endpoint="embed", tokens=12,
                 batch_id="b1", admitted_ms=ms(0.11), dispatched_ms=ms(0.12),
                 completed_ms=ms(0.15))
    rejected = Result(id="w-2", status="rejected", reason="rate_limited")
    got = [(ok, WALL0 + 0.06), (ok2, WALL0 + 0.2), (rejected, WALL0 + 0.25), None, None]
    out = outcomes_of(CONFIG, items, got, sent, {4: "KafkaError()"}, WALL0)
    assert [o.id for o in out] == [f"orig-{i}" for i in range(5)]
    assert [o.status for o in out] == ["ok", "ok", "rejected", "missing", "failed"]
    assert out[0].latency_s == pytest.approx(0.05, abs=1e-3)
    assert out[0].tier == "standard"
    assert out[0].batch_tokens == 22 and out[0].batch_budget == 4096
    assert out[2].reason == "rate_limited"
    assert out[3].reason == "no_result_within_timeout"
    assert out[4].reason == "replay_send_failed"


def test_latency_is_clamped_between_send_and_receipt():
    """A worker clock ahead or behind cannot make latency negative or longer than observed."""
    items = [item(0), item(1)]
    sent = [WALL0, WALL0 + 1.0]
    behind = Result(id="a", status="ok", completed_ms=ms(-5.0))
    ahead = Result(id="b", status="ok", completed_ms=ms(9.0))
    out = outcomes_of(CONFIG, items, [(behind, WALL0 + 0.3), (ahead, WALL0 + 1.4)], sent, {},
                    WALL0)
    assert out[0].latency_s == pytest.approx(0.0)
    assert out[1].latency_s == pytest.approx(0.4, abs=1e-3)


def outcome(i: int, org: str, admitted: float, dispatched: float, batch: str,
            tokens: int = 100, express: bool = False) -> Outcome:
    return Outcome(id=f"{org}-{i}", org=org, tier="standard", endpoint="embed", status="ok",
                   arrival_s=admitted, admitted_s=admitted, dispatched_s=dispatched,
                   completed_s=dispatched + 0.1, batch_id=batch, tokens=tokens,
                   express=express)


def test_live_jain_is_one_when_backlogged_orgs_share_equally():
    """Two orgs waiting together and served alike batch after batch score 1.0."""
    outs = []
    for b in range(10):
        for org in ("bulkcorp", "searchco"):
            outs.append(outcome(b, org, 0.0, 1.0 + b, f"b{b}"))
    index, groups = live_jain(outs, CONFIG)
    assert index == pytest.approx(1.0)
    assert groups[0]["orgs"] == ["bulkcorp", "searchco"]


def test_live_jain_is_half_when_one_waiting_org_gets_everything():
    """FIFO-like: one org is served while the other waits the whole time: 0.5."""
    outs = [outcome(b, "bulkcorp", 0.0, 1.0 + b, f"b{b}") for b in range(10)]
    outs.append(outcome(0, "quiet-1", 0.5, 20.0, "b-last"))
    index, _ = live_jain(outs, CONFIG)
    assert index == pytest.approx(0.5)


def test_live_jain_leaves_express_batches_out_as_the_simulator_does():
    """Two orgs share ten batches alike (1.0); between them, express batches take one
    org's fresh requests ahead of the turns. Counted, they would favour it (0.9 and below);
    left out, the index stays 1.0, and the express requests still leave the held counts."""
    outs = []
    for b in range(10):
        for org in ("bulkcorp", "searchco"):
            outs.append(outcome(b, org, 0.0, 1.0 + b, f"b{b}"))
        outs.append(outcome(100 + b, "searchco", 0.5 + b, 1.5 + b, f"x{b}", tokens=400,
                            express=True))
    index, groups = live_jain(outs, CONFIG)
    assert index == pytest.approx(1.0)
    # The last regular batch takes both orgs' last turn requests: nine counted.
    assert groups[0]["batches"] == 9
    assert groups[0]["served_cost"] == {"bulkcorp": 900.0, "searchco": 900.0}


def test_a_results_express_flag_reaches_its_outcome():
    """outcomes_of copies Result.express, which live_jain reads."""
    items = [item(0), item(1)]
    got = [(Result(id="a", status="ok", batch_id="x1", express=True), WALL0 + 0.3),
           (Result(id="b", status="ok", batch_id="b1"), WALL0 + 0.4)]
    out = outcomes_of(CONFIG, items, got, [WALL0, WALL0], {}, WALL0)
    assert [o.express for o in out] == [True, False]


def test_live_jain_none_when_nobody_waited_together():
    """An org served in the first batch after it arrives never counts as backlogged."""
    outs = [outcome(b, "bulkcorp", b, b + 0.5, f"b{b}") for b in range(5)]
    assert live_jain(outs, CONFIG) == (None, [])


def test_peak_per_second():
    """The busiest one-second window of a burst."""
    assert peak_per_s([]) == 0
    assert peak_per_s([0.0, 0.1, 0.2, 1.5, 1.6]) == 3
    assert peak_per_s([0.0, 0.25, 0.5, 0.75, 1.0, 1.25]) == 4


def test_batch_time_fitted_from_results():
    """Per-batch model time (summed shares) fits overhead + ms/token; too little data gives None."""
    from traffic.replay_outcomes import fit_batch_time

    results = []
    for b, (n, tokens) in enumerate([(2, 50), (4, 50), (8, 50)]):
        total_ms = 5.0 + 0.1 * n * tokens
        results += [Result(id=f"{b}-{i}", status="ok", batch_id=f"b{b}", tokens=tokens,
                           inference_ms=total_ms / n) for i in range(n)]
    fit = fit_batch_time(results)
    assert fit["batches"] == 3
    assert fit["overhead_ms"] == pytest.approx(5.0)
    assert fit["ms_per_token"] == pytest.approx(0.1)
    assert fit_batch_time(results[:2]) is None


def test_late_requests_are_the_ok_requests_over_their_orgs_bound():
    """Sent to done over the org's bound: its result (here through its stage split); within
    it, failed, unanswered or of an org with no bound: nothing."""
    def out(i: int, org: str, took_s: float, status: str = "ok") -> Outcome:
        return Outcome(id=f"r{i}", org=org, status=status, arrival_s=10.0,
                       completed_s=10.0 + took_s)

    def got(i: int) -> tuple[Result, float]:
        return (Result(id=f"r{i}", status="ok", created_ms=1_000, fetched_ms=1_000 + i), 1.2)

    outcomes = [out(0, "a", 0.050), out(1, "a", 0.300), out(2, "a", 0.300, "rejected"),
                out(3, "b", 0.300), out(4, "a", 0.300)]
    results = [got(0), got(1), got(2), got(3), None]
    late = [request_stages(r, ms)
            for r, ms in late_requests(outcomes, results, {"a": 200.0, "b": None})]
    assert late == [{"to admission": 1.0}]  # r1 only: fetched 1 ms after it was sent


def test_results_ms_drops_the_unanswered_and_turns_epoch_seconds_into_milliseconds():
    """The stage functions take milliseconds; a replay keeps seconds (given seconds, the
    delivery stage's usual time once came out 0: 5474f2a)."""
    a = Result(id="a", status="ok")
    b = Result(id="b", status="ok")
    assert results_ms([(a, 1.25), None, (b, 2.0)]) == [(a, 1250.0), (b, 2000.0)]


def test_sent_after_is_each_late_request_created_against_the_bursts_start_in_order():
    late = [(Result(id="b", status="ok", created_ms=12_500), 13_000.0),
            (Result(id="a", status="ok", created_ms=10_250), 11_000.0),
            (Result(id="c", status="ok"), 11_000.0)]  # no stamp: not placed
    assert sent_after(late, 10.0) == [0.25, 2.5]
    assert sent_after(late, None) == []
    assert sent_line([0.25, 2.5]) == ("; sent 0.25 to 2.50 s after the burst's first request, "
                                      "1 of 2 within its first second")
    assert sent_line([]) == ""
