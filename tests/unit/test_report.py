"""The report: summaries from outcomes, Markdown, plots, comparison, and its command line."""

from __future__ import annotations

import argparse
import json

import msgspec
import pytest

import traffic.percentile
from traffic.report import (
    Outcome,
    QueueSample,
    add_arguments,
    compare,
    format_table,
    percentile,
    read_outcomes,
    run,
    summarize,
    write_report,
)


def ok(id: str, org: str, arrival: float, done: float, *, tokens: int = 10, batch: str = "b1",
       batch_tokens: int = 40, cost: float | None = None) -> Outcome:
    return Outcome(id=id, org=org, tier="standard", endpoint="embed", status="ok", tokens=tokens,
                   cost=cost, arrival_s=arrival, admitted_s=arrival, dispatched_s=arrival,
                   completed_s=done, batch_id=batch, batch_tokens=batch_tokens, batch_budget=80)


OUTCOMES = [
    ok("a1", "a", 0.0, 1.0), ok("a2", "a", 0.0, 2.0), ok("a3", "a", 0.0, 3.0, batch="b2"),
    ok("b1", "b", 0.5, 1.0, tokens=30),
    Outcome(id="b2", org="b", tier="standard", endpoint="embed", status="rejected",
            reason="rate_limited", arrival_s=0.6, completed_s=0.6),
    Outcome(id="c1", org="c", tier="free", endpoint="embed", status="expired",
            reason="deadline_passed", arrival_s=0.0, completed_s=0.5),
]


def test_the_report_uses_the_one_percentile():
    """traffic.report.percentile is traffic.percentile's, not a definition of its own."""
    assert percentile is traffic.percentile.percentile


def test_summary_counts_latency_and_share():
    """Per-org counts, latency from arrival to completion, and served share are right."""
    s = summarize(OUTCOMES)
    a, b, c = (s["orgs"][k] for k in "abc")
    assert (a["requests"], a["completed"], a["rejected"]) == (3, 3, 0)
    assert a["latency_ms"] == {"p50": 2000.0, "p90": 3000.0, "p99": 3000.0, "max": 3000.0}
    assert (b["requests"], b["completed"], b["rejected"]) == (2, 1, 1)
    assert b["latency_ms"]["max"] == 500.0
    assert (c["expired"], c["latency_ms"]["p50"]) == (1, None)
    assert a["served_share"] == pytest.approx(0.5) and b["served_share"] == pytest.approx(0.5)
    assert s["tiers"]["free"]["expired"] == 1
    assert s["rejections"] == {"rejected: rate_limited": 1, "expired: deadline_passed": 1}
    assert s["throughput_rps"] == pytest.approx(4 / 3.0, abs=1e-3)
    assert s["batches"]["count"] == 2 and s["batches"]["mean_fill"] == pytest.approx(0.5)
    assert s["batches"]["express"] == 0
    assert s["jain_index"] is None


def test_summary_counts_express_batches_once_each():
    """Two requests in one express batch and one in another: two express batches of three."""
    outs = [ok("a1", "a", 0.0, 1.0), *(
        msgspec.structs.replace(ok(f"q{i}", "q", 0.0, 1.0, batch=b), express=True)
        for i, b in enumerate(("x1", "x1", "x2")))]
    s = summarize(outs)
    assert (s["batches"]["count"], s["batches"]["express"]) == (3, 2)
    assert "3 batches (2 express)" in format_table(s)


def test_summary_uses_cost_when_known():
    """Served cost is the scheduler's charge when outcomes carry it, tokens otherwise."""
    s = summarize([ok("x", "a", 0, 1, tokens=10, cost=30.0), ok("y", "b", 0, 1, tokens=10,
                                                                   cost=10.0)])
    assert s["orgs"]["a"]["served_cost"] == 30.0 and s["orgs"]["a"]["served_share"] == 0.75


def test_table_names_orgs_and_missing_jain():
    """The printed table lists each org and says why Jain's index is missing."""
    text = format_table(summarize(OUTCOMES))
    assert "| a " in text and "| b " in text and "3,000.0" in text
    assert "Jain's index" in text and "n/a" in text


def test_compare_side_by_side():
    """``compare`` puts both runs' p99 per org next to each other with their ratio."""
    fast = summarize([ok("b1", "b", 0.0, 0.1)])
    slow = summarize([ok("b1", "b", 0.0, 5.0)])
    text = compare(fast, slow, labels=("drr", "fifo"))
    assert "p99 ms drr" in text and "p99 ms fifo" in text
    assert "50.00x" in text


def test_write_report_and_render_again(tmp_path):
    """A report directory has JSON, Markdown, inputs and six plots; render rebuilds it."""
    samples = [QueueSample(t_s=t, endpoint="embed", held_tokens_by_tier={"standard": n},
                           held_by_tier={"standard": n // 10}) for t, n in ((0, 30), (1, 10))]
    summary = write_report(tmp_path, OUTCOMES, samples, title="t",
                           summary=summarize(OUTCOMES, jain_index=0.9))
    names = {p.name for p in tmp_path.iterdir()}
    pngs = {"latency_cdf.png", "waiting.png", "served_share.png", "queue_depth.png",
            "not_served.png", "batch_fill.png"}
    assert pngs | {"report.json", "report.md", "outcomes.jsonl", "samples.jsonl"} <= names
    for png in pngs:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(summary))
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# t") and "![latency_cdf](latency_cdf.png)" in md
    assert read_outcomes(tmp_path / "outcomes.jsonl") == OUTCOMES
    (tmp_path / "report.json").unlink()
    assert run(parse("render", str(tmp_path))) == 0
    again = json.loads((tmp_path / "report.json").read_text())
    assert again["orgs"] == summary["orgs"]


def test_plots_with_nothing_served(tmp_path):
    """Plots still come out (saying so) when nothing was served or sampled."""
    write_report(tmp_path, [OUTCOMES[-1]], [])
    assert (tmp_path / "latency_cdf.png").stat().st_size > 0


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_cli_compare(tmp_path, capsys):
    """``report compare A.json B.json`` prints the side-by-side table, labelled by policy."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(summarize(OUTCOMES, meta={"policy": "drr"})))
    b.write_text(json.dumps(summarize(OUTCOMES, meta={"policy": "fifo"})))
    assert run(parse("compare", str(a), str(b))) == 0
    out = capsys.readouterr().out
    assert "p99 ms drr" in out and "p99 ms fifo" in out and "1.00x" in out
    assert run(parse("compare", str(a), str(tmp_path / "missing.json"))) == 2


def test_empty_run_still_reports():
    """An empty trace gives zero counts and a table, not an error."""
    s = summarize([])
    assert s["totals"]["requests"] == 0 and s["throughput_rps"] == 0.0
    assert "| org" in format_table(s)
