"""The order a batch runs in: the fewest-requests orgs first.

Which requests make up a batch is the fairness decision (:mod:`scheduler.lane`);
the order inside it is free, because the worker runs a batch in micro-batches
in the given order and publishes each micro-batch's results as soon as they
are ready (:mod:`worker.microbatch`, ``order="given"``). So the scheduler
hands the batch over in *run order*: by tier (higher first), then by how many
requests the org has in this batch (fewer first), then in the order DRR chose
them. A quiet org's one request then lands in the first micro-batch instead
of behind a bursting org's fifty, and comes back after a fraction of the
batch's service time; the bursting org's requests finish with the batch, as
they would anyway. Each org's own requests keep their relative order (its
priorities and deadlines), since the sort is stable.

Pure and tiny, so the scheduler service, the simulator and the tests can share it.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.entry import Entry

__all__ = ["run_order"]


def run_order(batch: Sequence[Entry], tier_names: Sequence[str]) -> list[Entry]:
    """``batch`` reordered for running: tier rank, then org's count in the batch, then given order.

    A tier not in ``tier_names`` (removed by a reload) ranks last.
    """
    rank = {name: i for i, name in enumerate(tier_names)}
    last = len(rank)
    count: dict[str, int] = {}
    for e in batch:
        count[e.org] = count.get(e.org, 0) + 1
    # Keys end in the position, unique: the sort never compares entries.
    keys = [(rank.get(e.tier, last), count[e.org], i) for i, e in enumerate(batch)]
    keys.sort()
    return [batch[k[2]] for k in keys]
