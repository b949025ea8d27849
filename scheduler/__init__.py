"""The fairness scheduler.

The core (``entry``, ``cost``, ``drr``, ``lane``, ``core``) is pure: it imports
only the standard library and ``schemas``, and time is an argument. The Kafka
service and the simulator are built around it in modules of their own and
are not imported here.

How a batch is chosen
---------------------

Requests wait per endpoint in a *lane*. Each lane has one DRR ring per tier;
each ring holds the orgs of that tier that have work; each org has a heap.
A batch is assembled by repeating three selections until it is full:

1. **Tier** (strict): the highest tier with work. A lower tier with
   ``min_share`` s earns s times the cost of every request served while it
   waits, and is served as soon as that credit covers its next request, so
   it receives at least about s of the served cost. Off by default.
2. **Org** (Deficit Round Robin): the org at the head of the tier's ring has
   the turn. A turn adds ``quantum x weight`` to its deficit; it is served
   while its deficit covers its next request's cost, then the turn passes.
   An org whose queue empties leaves the ring with its deficit reset: it
   cannot bank credit while idle. Cost per request is 1 (``requests``), its
   tokens (``tokens``) or tokens times the org's measured cost per token
   relative to the endpoint's, an exponential moving average fed back from
   workers (``adaptive``).
3. **Request**: the org's heap orders by priority (higher first), deadline
   (earlier first), arrival (earlier first).

The chosen request joins the batch if it fits ``max_batch_tokens`` and
``max_batch_size``; otherwise the batch closes and the request stays first in
line. A request past its deadline is never dispatched: each lane keeps all
deadlines in one heap and returns expired requests before every batch, even
from a tier that is starved.

Costs and bounds
----------------

Configuration guarantees ``quantum x weight >= largest request cost``, so a
new turn always covers the next request: a selection is O(1) in the number
of orgs and O(log n) in the chosen org's queue.

The fairness bound the property tests check: for two orgs i, j of one tier
that stay backlogged, at any point,
``|served_i / w_i - served_j / w_j| <= quantum + 2 x max_cost``
(served cost, in the lane's cost units; weights >= 1). Work conservation:
whenever a lane holds a request and a batch is asked for, the batch is not
empty.
"""

from scheduler.core import Policy, Scheduler
from scheduler.entry import Entry
from scheduler.lane import Dispatch, FifoLane, Lane, LaneStats

__all__ = ["Dispatch", "Entry", "FifoLane", "Lane", "LaneStats", "Policy", "Scheduler"]
