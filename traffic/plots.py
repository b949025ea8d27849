"""The report's pictures: who was served, who waited, and how full the batches were.

Each plot stands alone: a title that says what it shows, axis labels with
units, a legend. The orgs with the most requests are named (up to
``MAX_NAMED``, each with the same colour in every plot) and the rest are
grouped as "other". Matplotlib runs on the Agg backend: no display needed.

Plots, all from the report's inputs (:class:`~traffic.report.Outcome` and
:class:`~traffic.report.QueueSample`), so a simulated and a live run of
one trace draw the same pictures:

* ``latency_cdf.png`` -- per org, the share of its completed requests done
  within x ms (log x): a curve far to the right is an org that waited;
* ``waiting.png`` -- per org, requests arrived but not yet dispatched, over
  time (who waited, and for how long);
* ``served_share.png`` -- per org, the share of served cost over time,
  stacked (who was served);
* ``queue_depth.png`` -- tokens held by the scheduler per tier, over time;
* ``not_served.png`` -- requests not served, by status and reason, per org;
* ``batch_fill.png`` -- histogram of batch tokens over the token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display, and the same pixels everywhere

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter

from traffic.report import Outcome, QueueSample, percentile

__all__ = ["MAX_NAMED", "write_plots"]

#: Orgs named in the plots; the others are drawn together as "other".
MAX_NAMED = 6
_OTHER = "other"
_GREY = "#9e9e9e"


def _groups(outcomes: Sequence[Outcome]) -> tuple[dict[str, str], dict[str, str]]:
    """org -> group label, and group label -> colour (named orgs by requests, then other)."""
    counts: dict[str, int] = {}
    tiers: dict[str, str] = {}
    for o in outcomes:
        counts[o.org] = counts.get(o.org, 0) + 1
        tiers.setdefault(o.org, o.tier)
    ranked = sorted(counts, key=lambda org: (-counts[org], org))
    named = ranked if len(ranked) <= MAX_NAMED + 1 else ranked[:MAX_NAMED]
    rest = len(ranked) - len(named)
    other = f"{_OTHER} ({rest} orgs)"
    label = {org: (f"{org} ({tiers[org]})" if tiers[org] else org) if org in named else other
             for org in ranked}
    palette = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # tab10 is listed
    colours = {label[org]: palette[i % len(palette)] for i, org in enumerate(named)}
    if rest:
        colours[other] = _GREY
    return label, colours


def _time_label(span_s: float) -> tuple[float, str]:
    if span_s >= 3 * 3600:
        return 3600.0, "time since the trace started (h)"
    if span_s >= 600:
        return 60.0, "time since the trace started (min)"
    return 1.0, "time since the trace started (s)"


def _latency_cdf(ax, outcomes, label, colours) -> None:
    lat: dict[str, list[float]] = {g: [] for g in colours}
    total: dict[str, int] = {g: 0 for g in colours}
    for o in outcomes:
        g = label[o.org]
        total[g] += 1
        if o.latency_s is not None:
            lat[g].append(max(o.latency_s * 1000.0, 1e-3))
    drawn = False
    for g, xs in lat.items():
        if not xs:
            continue
        xs.sort()
        n = len(xs)
        p99 = percentile(xs, 99)  # as in the tables
        assert p99 is not None  # xs is not empty
        missing = total[g] - n
        extra = f", {missing:,} not served" if missing else ""
        # Start each curve on the axis, so a lone step still reads as "0 % before".
        ys = np.concatenate([[0.0], np.arange(1, n + 1) / n * 100.0])
        ax.step([xs[0], *xs], ys, where="post", color=colours[g], lw=2,
                label=f"{g}: {n:,} done, p99 {_human_ms(p99)}{extra}")
        drawn = True
    ax.set_xscale("log")
    ax.set_ylim(0, 101)
    _finish_curves(ax, "latency: arrival to batch done (ms, log scale)",
                   "requests done within this latency (% of the org's completed)",
                   "Latency per org: a curve to the right means the org waited",
                   drawn=drawn, legend_loc="best", nothing="No request completed")


def _finish_curves(ax, xlabel: str, ylabel: str, title: str, *, drawn: bool, legend_loc: str,
                   nothing: str) -> None:
    """Axis labels, title, a grid on both log scales; the legend at ``legend_loc`` where
    a curve was ``drawn``, else ``nothing`` written across the plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(loc=legend_loc, fontsize=9)
    else:
        _empty(ax, nothing)


def _human_ms(ms: float) -> str:
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    if ms >= 1_000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms"


def _waiting(ax, outcomes, label, colours, scale: float, xlabel: str) -> None:
    events: dict[str, list[tuple[float, int]]] = {g: [] for g in colours}
    longest: dict[str, float] = dict.fromkeys(colours, 0.0)
    for o in outcomes:
        if o.status in ("rejected", "invalid"):
            continue  # refused at the door: never waited in the scheduler
        left = o.dispatched_s if o.dispatched_s is not None else o.completed_s
        if left is None:
            continue
        g = label[o.org]
        longest[g] = max(longest[g], left - o.arrival_s)
        ev = events[g]
        ev.append((o.arrival_s, 1))
        ev.append((left, -1))
    peak = 0
    for g, ev in events.items():
        if not ev:
            continue
        ev.sort()
        t = np.array([e[0] for e in ev]) / scale
        n = np.cumsum([e[1] for e in ev])
        t = np.concatenate([[0.0], t])
        n = np.concatenate([[0], n])
        peak = max(peak, int(n.max()))
        ax.step(t, n, where="post", color=colours[g], lw=1.8,
                label=f"{g}: up to {n.max():,} waiting, longest wait "
                      f"{_human_ms(longest[g] * 1000)}")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(0, max(2, peak) * 1.5)
    _finish_curves(ax, xlabel, "requests waiting in the scheduler (log scale)",
                   "Who waited: requests arrived but not yet dispatched, per org",
                   drawn=peak > 0, legend_loc="upper right", nothing="Nothing ever waited")


def _served_share(ax, outcomes, label, colours, scale: float, xlabel: str) -> None:
    served = [o for o in outcomes if o.status == "ok"]
    if not served:
        _empty(ax, "No request was served")
        return
    groups = list(colours)
    index = {g: i for i, g in enumerate(groups)}
    # Work is spread over the time its batch was in service (dispatch to done),
    # per batch: binning by dispatch instant alone would alias with batch times.
    batches: dict[str, list] = {}
    for o in served:
        end = o.completed_s if o.completed_s is not None else o.arrival_s
        start = o.dispatched_s if o.dispatched_s is not None else end
        b = batches.setdefault(o.batch_id or o.id, [start, end, np.zeros(len(groups))])
        b[2][index[label[o.org]]] += o.cost if o.cost is not None else o.tokens
    t1 = max(b[1] for b in batches.values())
    # Fine bins, then shares over a sliding window of a tenth of the run: DRR
    # is fair over rounds, not within one, and a window of a few rounds shows
    # the split it converges to instead of the turn-by-turn alternation.
    bins, per_window = 400, 40
    width = max(t1 / bins, 1e-4)
    amount = np.zeros((len(groups), bins))
    for start, end, work in batches.values():
        first, last = min(int(start / width), bins - 1), min(int(end / width), bins - 1)
        if end - start <= 0 or first == last:
            amount[:, first] += work
            continue
        for k in range(first, last + 1):
            overlap = min(end, (k + 1) * width) - max(start, k * width)
            amount[:, k] += work * max(0.0, overlap) / (end - start)
    box = np.ones(per_window)
    windowed = np.array([np.convolve(row, box, mode="same") for row in amount])
    total = windowed.sum(axis=0)
    busy = amount.sum(axis=0) > 0  # idle stretches stay white
    share = np.divide(windowed, total, out=np.zeros_like(windowed),
                      where=(total > 0) & busy) * 100.0
    centres = width * (np.arange(bins) + 0.5) / scale
    overall = amount.sum(axis=1) / amount.sum() * 100.0
    keep = [g for g in groups if overall[index[g]]]  # never served: nothing to stack
    ax.stackplot(centres, *(share[index[g]] for g in keep), colors=[colours[g] for g in keep],
                 labels=[f"{g}: {_pct(overall[index[g]])} overall" for g in keep],
                 alpha=0.9, linewidth=0)
    unit = "cost" if all(o.cost is not None for o in served) else "tokens"
    ax.set_ylim(0, 100)
    ax.set_xlim(0, t1 / scale)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"share of served {unit} (%, sliding {_human_ms(per_window * width * 1000)})")
    ax.set_title("Who was served: each org's share of the work in service over time "
                 "(white: idle)")
    # Outside the axes: any corner inside would hide some org's band.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, title="org (tier)")


def _pct(v: float) -> str:
    if v == 0:
        return "0 %"
    if v < 0.01:
        return "<0.01 %"
    return f"{v:.2f} %" if v < 10 or v > 99 else f"{v:.1f} %"


def _queue_depth(ax, samples: Sequence[QueueSample], scale: float, xlabel: str) -> None:
    series: dict[str, tuple[list[float], list[int]]] = {}
    endpoints = {s.endpoint for s in samples}
    for s in samples:
        for tier, tokens in s.held_tokens_by_tier.items():
            key = f"{s.endpoint} / {tier}" if len(endpoints) > 1 else tier
            ts, vs = series.setdefault(key, ([], []))
            ts.append(s.t_s / scale)
            vs.append(tokens)
    series = {k: v for k, v in series.items() if any(v[1])}
    if not series:
        _empty(ax, "The scheduler never held a request (or no samples were taken)")
        return
    for key, (ts, vs) in series.items():
        ax.step(ts, vs, where="post", lw=1.8, label=f"{key}: peak {max(vs):,} tokens")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens held by the scheduler")
    ax.set_title("Queue depth per tier: work waiting for a free worker slot")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)


def _not_served(ax, outcomes, label, colours) -> None:
    reasons: dict[str, dict[str, int]] = {}
    for o in outcomes:
        if o.status == "ok":
            continue
        key = f"{o.status}: {o.reason or 'unspecified'}"
        per = reasons.setdefault(key, {})
        per[label[o.org]] = per.get(label[o.org], 0) + 1
    if not reasons:
        _empty(ax, "Every request was served:\nnone rejected, expired, invalid or failed")
        ax.set_title("Requests not served, by reason")
        return
    keys = sorted(reasons, key=lambda k: -sum(reasons[k].values()))
    left = np.zeros(len(keys))
    for g in colours:
        vals = np.array([reasons[k].get(g, 0) for k in keys])
        if vals.any():
            ax.barh(keys, vals, left=left, color=colours[g], label=g)
            left += vals
    for y, total in enumerate(left):
        ax.text(total, y, f" {int(total):,}", va="center")
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.15)
    ax.set_xlabel("requests")
    ax.set_ylabel("status: reason")
    ax.set_title("Requests not served, by reason and org")
    ax.legend(loc="lower right", fontsize=9)


def _batch_fill(ax, outcomes) -> None:
    fills: dict[str, float] = {}
    for o in outcomes:
        if o.batch_id is not None and o.batch_tokens is not None and o.batch_budget:
            fills[o.batch_id] = 100.0 * o.batch_tokens / o.batch_budget
    if not fills:
        _empty(ax, "No batch was served")
        ax.set_title("Batch fill")
        return
    xs = np.array(list(fills.values()))
    counts, edges, _ = ax.hist(xs, bins=np.linspace(0, 100, 21), color="#4c72b0",
                               edgecolor="white")
    for c, left in zip(counts, edges, strict=False):  # one edge more than bins
        if c:
            ax.text(left + 2.5, c, f"{int(c):,}", ha="center", va="bottom", fontsize=9)
    ax.axvline(xs.mean(), color="black", ls="--", lw=1.2, label=f"mean {xs.mean():.1f} %")
    ax.set_xlim(0, 100)
    ax.set_xlabel("batch fill: tokens in the batch / max_batch_tokens (%)")
    ax.set_ylabel("batches")
    ax.set_title(f"Batch fill over {len(xs):,} batches (right = full batches)")
    ax.legend(loc="upper left")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def write_plots(out_dir: str | Path, outcomes: Sequence[Outcome],
                samples: Sequence[QueueSample] = (), *, title: str = "") -> list[Path]:
    """Draw every plot into ``out_dir``; returns the files written."""
    out = Path(out_dir)
    label, colours = _groups(outcomes)
    ends = [t for o in outcomes for t in (o.completed_s, o.arrival_s) if t is not None]
    scale, xlabel = _time_label(max(ends, default=0.0))
    figures = {
        "latency_cdf": lambda ax: _latency_cdf(ax, outcomes, label, colours),
        "waiting": lambda ax: _waiting(ax, outcomes, label, colours, scale, xlabel),
        "served_share": lambda ax: _served_share(ax, outcomes, label, colours, scale, xlabel),
        "queue_depth": lambda ax: _queue_depth(ax, samples, scale, xlabel),
        "not_served": lambda ax: _not_served(ax, outcomes, label, colours),
        "batch_fill": lambda ax: _batch_fill(ax, outcomes),
    }
    written = []
    for name, draw in figures.items():
        fig, ax = plt.subplots(figsize=(10, 5.6))
        try:
            draw(ax)
            if title:
                fig.suptitle(title, fontsize=10, color="#555555", x=0.01, ha="left")
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
        finally:
            plt.close(fig)
    return written
