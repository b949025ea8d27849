"""Selections per second of the scheduler core, against a naive O(orgs) scan; bytes per held request.

Why: DESIGN section 2 promises that with ``quantum x weight >= largest
request cost`` each DRR selection is O(1) in the number of orgs, so a lane
with 100,000 backlogged orgs decides as fast as one with 10. Targets: at
least 100,000 selections/s with 100,000 backlogged orgs on one core, and a
per-selection cost that grows less than 2x from 10 to 100,000 orgs.

What is measured:

* ``drr``: :meth:`scheduler.Scheduler.next_batch` on one endpoint, one tier,
  token cost (quantum 512 = the largest request; one org in ten has weight
  2), batches of up to 64 requests / 8,192 tokens, requests of 256-512 tokens.
  Every org holds 8 requests (40 below 100 orgs: more than a batch can
  take from one org); each request served is replaced by a new one of the
  same org after the call, outside the timed section, so every org stays
  backlogged (checked) and the lane holds ``8 x orgs`` requests throughout.
  Selections/s = requests chosen / CPU seconds of this thread inside
  ``next_batch`` (``time.thread_time``: expiry check, DRR, heap, batch
  budget and held-id bookkeeping included; what other processes of a shared
  machine take is not counted, their effect on the caches is).
* ``naive``: the classic O(orgs) choice, written as fast as pure Python
  allows (:class:`NaiveScan`): for each selection, find the org with work
  and the least weighted served cost by a C-level ``min`` over a list of
  all orgs, then take its best request; same batches, same refill.
* growth: per-selection time at the largest org count over the smallest.
* memory: bytes per held request in the core beyond its payload, counted
  by ``tracemalloc`` while pushing into a fresh :class:`Scheduler`: the
  :class:`~scheduler.entry.Entry`, its org-heap item, the held-id map and,
  for a request with a deadline, its deadline-heap item. The request id is
  created beforehand (the payload owns it; the core holds a reference).
  ``--million`` adds 1,000,000 held requests over 100,000 orgs (also timed).
  The service's own overhead per held request is ``bench/memory.py``'s.

Each figure is the best of ``--rounds`` timed rounds (the machine is shared).
Exit status: 0 when both targets are met, 1 when one is not, 2 when the run
did not check them (``--orgs`` without 10 or without 100,000).

Run: ``python bench/core.py`` (~1.5 min on 2 cores), ``--quick`` (~40 s),
``--million`` (adds ~30 s); ``--json OUT`` also writes the figures (``rows``,
``drr_growth``, ``targets_checked``, ``held_bytes``).

Measured on the 2-core development machine, Python 3.11 (``python bench/core.py
--million``; the machine is shared, so figures move by 10-20% between runs):

========  ==========  ===========  =========  ==========  ============
orgs      drr sel/s   naive sel/s  drr/naive  drr ns/sel  naive ns/sel
========  ==========  ===========  =========  ==========  ============
10        507,715     1,136,348    0.4x       1,970       880
1,000     354,762     56,995       6.2x       2,819       17,545
100,000   296,821     830          357.6x     3,369       1,204,655
========  ==========  ===========  =========  ==========  ============

Per-selection cost growth 10 -> 100,000 orgs: drr 1.71x (1.5-1.8x over
runs), naive 1369x. Both targets met: ~3x the 100,000 selections/s asked
for at 100,000 orgs. With 10 orgs the naive scan is faster (its whole state
is one short list); DRR overtakes it at about 100 orgs. The DRR growth is
memory, not algorithm: at 100,000 orgs each selection touches an org, heap,
tuple and entry that are no longer in the CPU caches. Profiling (cProfile)
shows the rest is Python call overhead spread over peek, take, heappop and
accounting; inlining two of those calls gained 5-10%, not worth the
duplicated logic while the target holds with this margin.

Memory in the core per held request beyond its payload: 329 B without a
deadline, 425 B with one (100,000 held); 439 B with 1,000,000 held over
100,000 orgs (419 MiB), pushed at 3-6 us each.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from heapq import heappop, heappush
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import write_json
from scheduler import Entry, Scheduler
from scheduler.entry import DISPATCHED, NO_DEADLINE
from schemas.build import build_config
from schemas.config import Config

ENDPOINT = "embed"
TIER = "standard"


def depth(n_orgs: int) -> int:
    """Requests held per org: more than one batch can take from it.

    A batch holds at most 32 requests (8,192 tokens of >= 256); from 100 orgs
    up it spans less than a round, so an org gives it at most one turn (<= 5).
    """
    return 8 if n_orgs >= 100 else 8 + 32
SIZES = (256, 512)  # a turn (< 1,536 with weight 2) then takes at most 5 requests


def bench_config(n_orgs: int) -> Config:
    """One tier, token cost, quantum = largest request; one org in ten has weight 2."""
    return build_config(
        tiers=[TIER],
        endpoints={ENDPOINT: {
            "model": None, "cost_model": "tokens", "quantum": SIZES[1],
            "max_request_tokens": SIZES[1], "max_batch_tokens": 8192, "max_batch_size": 64,
        }},
        orgs={f"org{i}": {"tier": TIER, "weight": 2.0 if i % 10 == 0 else 1.0}
              for i in range(n_orgs)},
    ).config


class NaiveScan:
    """The O(orgs) baseline: each selection scans every org for the least weighted served cost.

    ``key[i]`` is org i's served tokens / weight while it has work, infinity
    otherwise; ``min`` and ``list.index`` scan it in C. The chosen org's best
    request (its heap is ordered as the core's) joins the batch under the same
    budgets. No expiry, no tiers: only what the comparison needs.
    """

    def __init__(self, config: Config):
        ep = config.endpoints[ENDPOINT]
        self.max_size, self.max_tokens = ep.max_batch_size, ep.max_batch_tokens
        self.weight_of = {name: o.weight for name, o in config.orgs.items()}
        self.index: dict[str, int] = {}
        self.key: list[float] = []
        self.served: list[float] = []
        self.weight: list[float] = []
        self.heaps: list[list] = []
        self.seq = 0

    def push(self, e: Entry) -> None:
        i = self.index.get(e.org)
        if i is None:
            i = self.index[e.org] = len(self.key)
            self.key.append(NO_DEADLINE)
            self.served.append(0.0)
            self.weight.append(self.weight_of.get(e.org, 1.0))
            self.heaps.append([])
        self.seq += 1
        heappush(self.heaps[i], (-e.priority, e.deadline, e.arrival, self.seq, e))
        if self.key[i] == NO_DEADLINE:
            if self.served[i]:
                # No banked credit: a returning org starts level with the least served.
                floor = min(self.key)
                if floor != NO_DEADLINE:
                    self.served[i] = max(self.served[i], floor * self.weight[i])
            self.key[i] = self.served[i] / self.weight[i]

    def next_batch(self, now: float) -> list[Entry]:
        key, heaps, served, weight = self.key, self.heaps, self.served, self.weight
        batch: list[Entry] = []
        tokens = 0
        while len(batch) < self.max_size:
            least = min(key)
            if least == NO_DEADLINE:
                break
            i = key.index(least)
            e = heaps[i][0][-1]
            if batch and tokens + e.tokens > self.max_tokens:
                break
            heappop(heaps[i])
            served[i] += e.tokens
            key[i] = served[i] / weight[i] if heaps[i] else NO_DEADLINE
            e.state = DISPATCHED
            tokens += e.tokens
            batch.append(e)
        return batch


def _fill(push, n_orgs: int, rng: random.Random, per_org: int) -> int:
    n = 0
    for _ in range(per_org):
        for i in range(n_orgs):
            n += 1
            push(Entry(f"r{n}", f"org{i}", TIER, rng.randint(*SIZES)))
    return n


def selections_per_second(policy: str, n_orgs: int, seconds: float, rounds: int) -> float:
    """Best of ``rounds``: requests chosen per second spent choosing them, all orgs backlogged."""
    rng = random.Random(n_orgs)
    config = bench_config(n_orgs)
    if policy == "drr":
        sched = Scheduler(config)

        def push(e):
            sched.push(ENDPOINT, e)

        def take(now):
            return sched.next_batch(ENDPOINT, now).batch

        orgs = sched.lanes[ENDPOINT].tiers[0].orgs
    else:
        naive = NaiveScan(config)
        push, take = naive.push, naive.next_batch
    # The naive scan picks the least served org: from 100 orgs up a batch takes at most
    # one request per org, so two each keep it backlogged (and its fill quick).
    per_org = depth(n_orgs) if policy == "drr" or n_orgs < 100 else 2
    n = _fill(push, n_orgs, rng, per_org)
    gc.collect()
    best = 0.0
    for _ in range(rounds):
        spent, chosen = 0.0, 0
        while spent < seconds:
            t0 = time.thread_time()
            batch = take(0.0)
            spent += time.thread_time() - t0
            chosen += len(batch)
            if policy == "drr":
                assert len(orgs) == n_orgs, "an org emptied: the lane is not all backlogged"
            for e in batch:  # keep the org backlogged: a new request replaces the one served
                n += 1
                push(Entry(f"r{n}", e.org, TIER, rng.randint(*SIZES)))
        best = max(best, chosen / spent)
    if policy == "drr":
        assert sched.lanes[ENDPOINT].held == depth(n_orgs) * n_orgs
    return best


def held_bytes(n_requests: int, n_orgs: int, deadlines: bool) -> tuple[float, float]:
    """Bytes per held request in the core beyond its payload (tracemalloc), and push time.

    The push time (CPU, Entry creation and garbage collection included) is
    measured first, without tracemalloc (which slows allocation several
    times), on a scheduler built the same way.
    """
    rng = random.Random(7)
    ids = [f"req-{i:012d}" for i in range(n_requests)]  # the payload's: created outside
    orgs = [f"org{i}" for i in range(n_orgs)]
    tokens = [rng.randint(*SIZES) for _ in range(n_requests)]

    def fill() -> Scheduler:
        sched = Scheduler(bench_config(0))
        for i, rid in enumerate(ids):
            sched.push(ENDPOINT, Entry(rid, orgs[i % n_orgs], TIER, tokens[i],
                                       deadline=1e9 + i if deadlines else None))
        assert sched.held == n_requests
        return sched

    gc.collect()
    t0 = time.thread_time()
    fill()
    push_s = (time.thread_time() - t0) / n_requests
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    sched = fill()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del sched
    return used / n_requests, push_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter rounds (< 1 min in all)")
    ap.add_argument("--million", action="store_true", help="also hold 1,000,000 requests")
    ap.add_argument("--orgs", default="10,1000,100000", help="org counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per row (best kept)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.orgs.split(",")]
    seconds = 0.4 if args.quick else 1.5
    rounds = args.rounds or (2 if args.quick else 3)

    print(f"Selections/s, all orgs backlogged, best of {rounds} x {seconds:g} s "
          f"(Python {sys.version.split()[0]})")
    print(f"{'orgs':>8}  {'drr sel/s':>12}  {'naive sel/s':>12}  {'drr/naive':>9}  "
          f"{'drr ns/sel':>10}  {'naive ns/sel':>12}")
    rows = []
    for n_orgs in counts:
        drr = selections_per_second("drr", n_orgs, seconds, rounds)
        naive = selections_per_second("naive", n_orgs, min(seconds, 0.5), rounds)
        rows.append((n_orgs, drr, naive))
        print(f"{n_orgs:>8,}  {drr:>12,.0f}  {naive:>12,.0f}  {drr / naive:>8.1f}x  "
              f"{1e9 / drr:>10,.0f}  {1e9 / naive:>12,.0f}", flush=True)
    (lo, drr_lo, naive_lo), (hi, drr_hi, naive_hi) = rows[0], rows[-1]
    drr_growth, naive_growth = drr_lo / drr_hi, naive_lo / naive_hi
    print(f"Per-selection cost growth {lo:,} -> {hi:,} orgs: drr {drr_growth:.2f}x, "
          f"naive {naive_growth:.0f}x")
    # The targets are set at 100,000 orgs and over 10 -> 100,000 orgs: a run that
    # stops short of either end has not checked them, whatever its figures.
    checked = lo <= 10 and hi >= 100_000
    ok_rate, ok_growth = drr_hi >= 100_000, drr_growth < 2
    if checked:
        print(f"Targets: >= 100,000 sel/s at {hi:,} orgs: {'met' if ok_rate else 'NOT met'} "
              f"({drr_hi:,.0f}); growth < 2x: {'met' if ok_growth else 'NOT met'}")
    else:
        print(f"Targets NOT CHECKED: they are set at 100,000 orgs and over 10 -> 100,000 orgs; "
              f"this run covered {lo:,} -> {hi:,} (--orgs must include both)")

    figures: dict = {
        "rows": [{"orgs": n, "drr_sel_per_s": d, "naive_sel_per_s": nv} for n, d, nv in rows],
        "drr_growth": drr_growth, "naive_growth": naive_growth, "targets_checked": checked,
        "held_bytes": {}}
    n_mem = 20_000 if args.quick else 100_000
    print(f"\nMemory per held request in the core, beyond its payload ({n_mem:,} held, "
          f"1,000 orgs, tracemalloc)")
    for deadlines in (False, True):
        per, push_s = held_bytes(n_mem, 1000, deadlines)
        label = "with a deadline" if deadlines else "no deadline"
        figures["held_bytes"]["deadline" if deadlines else "no_deadline"] = per
        print(f"  {label:<16} {per:>6,.0f} B/request   push {push_s * 1e6:.2f} us/request")
    sample = Entry("req-000000000001", "org1", TIER, 300, deadline=1e9)
    sample.seq = 10**6
    print(f"  of which (sys.getsizeof; each tuple carries 16 B of GC header more, the "
          f"Entry none: it is not tracked): "
          f"Entry object {sys.getsizeof(sample)} B + its seq int "
          f"{sys.getsizeof(sample.seq)} B; org-heap item (a 5-tuple) "
          f"{sys.getsizeof((0, 0.0, 0.0, 0, sample))} B; held-id map item (a 2-tuple) "
          f"{sys.getsizeof(('e', sample))} B; deadline-heap item (a 3-tuple) "
          f"{sys.getsizeof((0.0, 0, sample))} B + its float {sys.getsizeof(1e9)} B; "
          f"list and dict slots make the rest")
    if args.million:
        per, push_s = held_bytes(1_000_000, 100_000, True)
        print(f"  1,000,000 held over 100,000 orgs, with deadlines: {per:,.0f} B/request, "
              f"{per * 1e6 / 2**20:,.0f} MiB in all, push {push_s * 1e6:.2f} us/request")
        figures["held_bytes"]["million"] = per
    write_json(args.json, figures)
    if not checked:
        return 2
    return 0 if ok_rate and ok_growth else 1


if __name__ == "__main__":
    sys.exit(main())
