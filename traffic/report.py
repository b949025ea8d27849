"""The fairness report: one format for the simulator and the live replay.

Both runs describe what happened as a list of :class:`Outcome` (one per
request: who sent it, what became of it, when it arrived, left the scheduler
and was done) plus :class:`QueueSample` time series (tokens held per tier,
which the simulator samples itself and the live replay reads from the
scheduler-state topic). Everything in the report is computed from those two
lists alone, so a simulated and a live run of one trace produce reports that
compare line by line (:func:`compare`).

A report directory holds ``report.json`` (:func:`summarize`), ``report.md``
(the same as tables), ``outcomes.jsonl`` and ``samples.jsonl`` (the inputs,
to join runs request by request or re-render) and the plots of
:mod:`traffic.plots`.

Definitions used throughout:

* latency: ``completed_s - arrival_s`` of an ``ok`` request, in ms: from the
  moment it was sent to the moment its batch was done;
* percentiles: nearest rank (:mod:`traffic.percentile`), always a value
  measured: p99 of five samples is the largest;
* served cost: the lane's cost of each served request when the run knows it
  (the simulator does), otherwise its tokens; share = an org's served cost
  over all served cost;
* throughput: ``ok`` requests per second from the first arrival to the last
  completion.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from traffic.percentile import percentile

__all__ = [
    "Outcome",
    "OutcomeStatus",
    "QueueSample",
    "add_arguments",
    "compare",
    "format_table",
    "percentile",
    "read_outcomes",
    "render_markdown",
    "run",
    "summarize",
    "write_report",
]

OutcomeStatus = Literal["ok", "rejected", "expired", "invalid", "failed", "missing"]
#: Order of the status columns everywhere.
STATUSES: tuple[str, ...] = ("ok", "rejected", "expired", "invalid", "failed", "missing")


class Outcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What became of one request. Times are seconds since the trace's start.

    ``missing`` is for the live replay: a request sent whose result never
    came back. ``admitted_s`` is when admission let it in, ``dispatched_s``
    when the scheduler put it in a batch, ``completed_s`` when its result
    was produced (for ``expired``/``rejected``, when that was decided).
    ``batch_budget`` is the endpoint's ``max_batch_tokens``, so
    ``batch_tokens / batch_budget`` is the fill of the request's batch.
    ``cost`` is what the scheduler charged the org, where the run knows it.
    ``express``: its batch was an express batch (``schemas.messages.Batch``),
    which takes a fresh org's request ahead of the turns and so shares
    nothing out among the backlogged orgs.
    """

    id: str
    org: str
    status: OutcomeStatus
    arrival_s: float
    tier: str = ""
    endpoint: str = ""
    reason: str | None = None
    tokens: int = 0
    cost: float | None = None
    admitted_s: float | None = None
    dispatched_s: float | None = None
    completed_s: float | None = None
    batch_id: str | None = None
    batch_tokens: int | None = None
    batch_budget: int | None = None
    express: bool = False

    @property
    def latency_s(self) -> float | None:
        if self.status != "ok" or self.completed_s is None:
            return None
        return self.completed_s - self.arrival_s


class QueueSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Backlog of one endpoint at one moment: what the scheduler held, per tier."""

    t_s: float
    endpoint: str
    held_tokens_by_tier: dict[str, int]
    held_by_tier: dict[str, int] = {}


def _latency_ms(latencies_s: list[float]) -> dict[str, float | None]:
    xs = sorted(latencies_s)
    out: dict[str, float | None] = {}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
        v = percentile(xs, q)
        out[name] = None if v is None else round(v * 1000.0, 3)
    return out


def summarize(outcomes: Sequence[Outcome], **extra: Any) -> dict[str, Any]:
    """The report's numbers, JSON-ready; ``extra`` keys are added at the top level.

    Keys: ``orgs.<org>.{tier, requests, completed, rejected, expired,
    invalid, failed, missing, latency_ms.{p50,p90,p99,max}, served_cost,
    served_share, served_tokens}``, ``tiers`` (the same, per tier),
    ``totals``, ``throughput_rps``, ``makespan_s``, ``rejections``
    (``"<status>: <reason>"`` -> count, for every request not ``ok``),
    ``batches.{count, express, mean_fill, p50_fill, mean_requests}`` and
    ``jain_index`` (None unless given in ``extra``).
    """
    orgs: dict[str, dict[str, Any]] = {}
    tiers: dict[str, dict[str, Any]] = {}
    lat_org: dict[str, list[float]] = {}
    lat_tier: dict[str, list[float]] = {}
    rejections: dict[str, int] = {}
    batches: dict[str, tuple[int, int, int]] = {}
    express: set[str] = set()
    totals = dict.fromkeys(("requests", "completed", *STATUSES[1:]), 0)
    served_total = 0.0
    first, last = float("inf"), float("-inf")
    for o in outcomes:
        for key, table, lat in ((o.org, orgs, lat_org), (o.tier or "-", tiers, lat_tier)):
            row = table.get(key)
            if row is None:
                row = table[key] = {"requests": 0, "completed": 0, **dict.fromkeys(STATUSES[1:], 0),
                                    "served_cost": 0.0, "served_tokens": 0}
                lat[key] = []
            row["requests"] += 1
        orgs[o.org].setdefault("tier", o.tier)
        totals["requests"] += 1
        first = min(first, o.arrival_s)
        if o.status == "ok":
            cost = o.cost if o.cost is not None else float(o.tokens)
            for key, table, lat in ((o.org, orgs, lat_org), (o.tier or "-", tiers, lat_tier)):
                table[key]["completed"] += 1
                table[key]["served_cost"] += cost
                table[key]["served_tokens"] += o.tokens
                if o.latency_s is not None:
                    lat[key].append(o.latency_s)
            totals["completed"] += 1
            served_total += cost
            if o.completed_s is not None:
                last = max(last, o.completed_s)
            if o.batch_id is not None and o.batch_tokens is not None:
                n = batches.get(o.batch_id, (0, 0, 0))[0]
                batches[o.batch_id] = (n + 1, o.batch_tokens, o.batch_budget or 0)
                if o.express:
                    express.add(o.batch_id)
        else:
            orgs[o.org][o.status] += 1
            tiers[o.tier or "-"][o.status] += 1
            totals[o.status] += 1
            key = f"{o.status}: {o.reason or 'unspecified'}"
            rejections[key] = rejections.get(key, 0) + 1
    for table, lat in ((orgs, lat_org), (tiers, lat_tier)):
        for key, row in table.items():
            row["latency_ms"] = _latency_ms(lat[key])
            row["served_cost"] = round(row["served_cost"], 3)
            row["served_share"] = round(row["served_cost"] / served_total, 6) if served_total else 0.0
    makespan = last - first if last > first else 0.0
    fills = sorted(t / b for _, t, b in batches.values() if b)
    summary: dict[str, Any] = {
        "orgs": dict(sorted(orgs.items(), key=lambda kv: (-kv[1]["requests"], kv[0]))),
        "tiers": tiers,
        "totals": totals,
        "throughput_rps": round(totals["completed"] / makespan, 3) if makespan else 0.0,
        "makespan_s": round(makespan, 6),
        "rejections": dict(sorted(rejections.items(), key=lambda kv: -kv[1])),
        "batches": {
            "count": len(batches),
            "express": len(express),
            "mean_fill": round(sum(fills) / len(fills), 4) if fills else None,
            "p50_fill": None if (p50 := percentile(fills, 50)) is None else round(p50, 4),
            "mean_requests": round(sum(n for n, _, _ in batches.values()) / len(batches), 2)
            if batches else None,
        },
        "jain_index": None,
    }
    summary.update(extra)
    return summary


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if v < 10_000 else f"{v:,.0f}"


def _table(header: list[str], rows: list[list[str]], align: str) -> str:
    """An aligned Markdown table: readable as it is in a terminal and rendered."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(cells, widths, align, strict=True)) + " |"

    sep = "|" + "|".join((":" + "-" * (w + 1)) if a == "l" else ("-" * (w + 1) + ":")
                         for w, a in zip(widths, align, strict=True)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def format_table(summary: dict[str, Any], *, max_orgs: int = 20) -> str:
    """The per-org table (top ``max_orgs`` by requests) and the overall figures."""
    header = ["org", "tier", "requests", "completed", "rejected", "expired", "other",
              "p50 ms", "p90 ms", "p99 ms", "max ms", "served share"]
    rows = []
    items = list(summary["orgs"].items())
    for org, r in items[:max_orgs]:
        lat = r["latency_ms"]
        other = r["invalid"] + r["failed"] + r["missing"]
        rows.append([org, r.get("tier") or "-", str(r["requests"]), str(r["completed"]),
                     str(r["rejected"]), str(r["expired"]), str(other),
                     *(_fmt_ms(lat[k]) for k in ("p50", "p90", "p99", "max")),
                     f"{100 * r['served_share']:.2f} %"])
    text = _table(header, rows, "ll" + "r" * 10)
    if len(items) > max_orgs:
        text += f"\n\n({len(items) - max_orgs} more orgs in report.json)"
    t = summary["totals"]
    jain = summary.get("jain_index")
    jain_text = f"{jain:.4f}" if jain is not None else (
        "n/a (" + summary.get("jain_note", "no two orgs of one tier stayed backlogged together")
        + ")")
    b = summary["batches"]
    fill = f"{100 * b['mean_fill']:.1f} %" if b["mean_fill"] is not None else "-"
    text += (
        f"\n\nrequests {t['requests']}, completed {t['completed']}, rejected {t['rejected']}, "
        f"expired {t['expired']}, invalid {t['invalid']}, failed {t['failed']}, "
        f"missing {t['missing']}"
        f"\nthroughput {summary['throughput_rps']:,.1f} requests/s over "
        f"{summary['makespan_s']:,.2f} s; {b['count']} batches"
        + (f" ({b['express']} express)" if b.get("express") else "")
        + f", mean fill {fill}"
        f"\nJain's index over backlogged orgs (served cost / weight): {jain_text}"
    )
    groups = summary.get("jain") or []
    if groups:
        g = groups[0]
        total = sum(g["served_cost"].values()) or 1.0
        split = ", ".join(f"{org} {100 * g['served_cost'][org] / total:.1f} % (weight "
                          f"{g['weights'][org]:g})" for org in g["orgs"][:8])
        more = f" and {len(g['orgs']) - 8} more" if len(g["orgs"]) > 8 else ""
        text += (f"\n  while {len(g['orgs'])} orgs of {g['endpoint']}/{g['tier']} were "
                 f"backlogged together ({g['batches']} batches): {split}{more}")
    return text


def render_markdown(summary: dict[str, Any], *, title: str, plots: Iterable[str] = ()) -> str:
    """``report.md``: the run's settings, the per-org and per-tier tables, the plots."""
    parts = [f"# {title}", ""]
    meta = summary.get("meta") or {}
    if meta:
        parts += ["| setting | value |", "|:--|:--|"]
        parts += [f"| {k} | {v} |" for k, v in meta.items()]
        parts.append("")
    parts += ["## Per org", "", format_table(summary, max_orgs=100), "", "## Per tier", ""]
    rows = [[tier, str(r["requests"]), str(r["completed"]), str(r["rejected"]), str(r["expired"]),
             *(_fmt_ms(r["latency_ms"][k]) for k in ("p50", "p90", "p99", "max")),
             f"{100 * r['served_share']:.2f} %"]
            for tier, r in summary["tiers"].items()]
    parts.append(_table(["tier", "requests", "completed", "rejected", "expired", "p50 ms",
                         "p90 ms", "p99 ms", "max ms", "served share"], rows, "l" + "r" * 9))
    if summary["rejections"]:
        parts += ["", "## Not served, by reason", ""]
        parts.append(_table(["status: reason", "requests"],
                            [[k, str(v)] for k, v in summary["rejections"].items()], "lr"))
    plots = list(plots)
    if plots:
        parts += ["", "## Plots", ""]
        parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(parts) + "\n"


def compare(a: dict[str, Any], b: dict[str, Any], *, labels: tuple[str, str] = ("A", "B")) -> str:
    """Two reports' per-org latency side by side, as Markdown (e.g. drr vs fifo)."""
    la, lb = labels
    header = ["org", "requests", f"completed {la}", f"completed {lb}", f"p50 ms {la}",
              f"p50 ms {lb}", f"p99 ms {la}", f"p99 ms {lb}", f"p99 {lb}/{la}"]
    rows = []
    orgs = list(dict.fromkeys([*a["orgs"], *b["orgs"]]))
    for org in orgs:
        ra, rb = a["orgs"].get(org), b["orgs"].get(org)
        pa = ra["latency_ms"]["p99"] if ra else None
        pb = rb["latency_ms"]["p99"] if rb else None
        ratio = f"{pb / pa:,.2f}x" if pa and pb is not None else "-"
        rows.append([
            org, str((ra or rb)["requests"]),
            str(ra["completed"]) if ra else "-", str(rb["completed"]) if rb else "-",
            _fmt_ms(ra["latency_ms"]["p50"] if ra else None),
            _fmt_ms(rb["latency_ms"]["p50"] if rb else None),
            _fmt_ms(pa), _fmt_ms(pb), ratio,
        ])
    text = _table(header, rows, "l" + "r" * 8)

    def jain(s: dict[str, Any]) -> str:
        return "n/a" if s.get("jain_index") is None else f"{s['jain_index']:.4f}"

    text += (f"\n\nthroughput {la} {a['throughput_rps']:,.1f} requests/s, "
             f"{lb} {b['throughput_rps']:,.1f} requests/s"
             f"\nJain's index {la} {jain(a)}, {lb} {jain(b)}")
    return text


def read_outcomes(path: str | Path) -> list[Outcome]:
    """Read an ``outcomes.jsonl`` written by :func:`write_report`."""
    dec = msgspec.json.Decoder(Outcome)
    with Path(path).open("rb") as f:
        return [dec.decode(line) for line in f if line.strip()]


def _read_samples(path: Path) -> list[QueueSample]:
    if not path.exists():
        return []
    dec = msgspec.json.Decoder(QueueSample)
    with path.open("rb") as f:
        return [dec.decode(line) for line in f if line.strip()]


def _write_jsonl(path: Path, items: Iterable[msgspec.Struct]) -> None:
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for item in items:
            f.write(enc.encode(item))
            f.write(b"\n")


def write_report(
    out_dir: str | Path,
    outcomes: Sequence[Outcome],
    samples: Sequence[QueueSample] = (),
    *,
    title: str = "Serving Fairness report",
    summary: dict[str, Any] | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Write the report directory; returns the summary (as in ``report.json``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if summary is None:
        summary = summarize(outcomes)
    summary = {"title": title, **summary}
    _write_jsonl(out / "outcomes.jsonl", outcomes)
    _write_jsonl(out / "samples.jsonl", samples)
    files: list[str] = []
    if plots:
        from traffic.plots import write_plots  # matplotlib only when plots are asked for

        files = [p.name for p in write_plots(out, outcomes, samples, title=title)]
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(summary, title=title, plots=files))
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommands: ``compare`` two reports, ``render`` a directory again."""
    sub = parser.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    cp = sub.add_parser("compare", help="two reports' per-org latency side by side (Markdown)")
    cp.add_argument("a", help="report.json (or simulate --json output) of the first run")
    cp.add_argument("b", help="report.json of the second run")
    cp.add_argument("--labels", default=None, metavar="A,B",
                    help="column labels (default: each report's policy or title)")
    cp.add_argument("--out", default=None, help="write the Markdown here instead of stdout")
    rn = sub.add_parser("render", help="rebuild report.json, report.md and the plots of a "
                        "directory from its outcomes.jsonl and samples.jsonl")
    rn.add_argument("dir")
    rn.add_argument("--title", default=None)


def _label(s: dict[str, Any], fallback: str) -> str:
    meta = s.get("meta") or {}
    return str(meta.get("label") or meta.get("policy") or fallback)


def run(args: argparse.Namespace) -> int:
    """Run a ``report`` subcommand; 0 on success, 2 on unreadable input."""
    if args.report_command == "render":
        d = Path(args.dir)
        try:
            outcomes = read_outcomes(d / "outcomes.jsonl")
            old = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else {}
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        extra = {k: v for k, v in old.items() if k in ("meta", "jain_index", "jain", "jain_note")}
        title = args.title or old.get("title") or "Serving Fairness report"
        write_report(d, outcomes, _read_samples(d / "samples.jsonl"), title=title,
                     summary=summarize(outcomes, **extra))
        print(f"report written to {d}", file=sys.stderr)
        return 0
    try:
        a = json.loads(Path(args.a).read_text())
        b = json.loads(Path(args.b).read_text())
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.labels:
        la, _, lb = args.labels.partition(",")
    else:
        la, lb = _label(a, "A"), _label(b, "B")
        if la == lb:
            la, lb = f"{la} (A)", f"{lb} (B)"
    text = compare(a, b, labels=(la, lb))
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0
